"""The circuit breaker of §6: a storm of permanent provider errors becomes transient."""

from __future__ import annotations

import pytest

from app.errors import InvalidInputError, PermanentError, TransientError
from app.service.circuit_breaker import CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def failing(error: Exception, calls: list[int]):
    async def operation():
        calls.append(1)
        raise error

    return operation


async def test_opens_after_threshold_and_stops_calling_until_cooldown():
    clock, calls = Clock(), []
    breaker = CircuitBreaker("embedding provider", threshold=3, cooldown_seconds=60, clock=clock)
    operation = failing(PermanentError("embedding upstream 401"), calls)

    for _ in range(3):
        with pytest.raises(PermanentError):
            await breaker.call(operation)
    for _ in range(2):
        with pytest.raises(TransientError, match="circuit open"):
            await breaker.call(operation)

    assert len(calls) == 3
    assert breaker.is_open
    clock.now = 61
    assert not breaker.is_open


async def test_success_after_cooldown_closes_it_and_resets_the_count():
    clock, calls = Clock(), []
    breaker = CircuitBreaker("judge provider", threshold=2, cooldown_seconds=10, clock=clock)
    forbidden = failing(PermanentError("judge upstream 403"), calls)
    for _ in range(2):
        with pytest.raises(PermanentError):
            await breaker.call(forbidden)
    with pytest.raises(TransientError):
        await breaker.call(forbidden)
    clock.now = 11

    async def healthy():
        return "ok"

    assert await breaker.call(healthy) == "ok"
    assert not breaker.is_open
    with pytest.raises(PermanentError):  # one error after a reset is below the threshold
        await breaker.call(forbidden)


async def test_input_errors_and_transient_errors_do_not_count():
    calls: list[int] = []
    breaker = CircuitBreaker("embedding provider", threshold=1, cooldown_seconds=60)
    with pytest.raises(InvalidInputError):
        await breaker.call(failing(InvalidInputError("blank"), calls))
    with pytest.raises(TransientError):
        await breaker.call(failing(TransientError("embedding upstream 503"), calls))
    assert not breaker.is_open
