"""The circuit breaker of §6: only provider-wide refusals count; half-open lets one probe by.

Concurrency is real (asyncio tasks) and driven by events: a probe is held on an event while
the other callers arrive. Time is a fake clock, so a cooldown passes without sleeping.
"""

from __future__ import annotations

import asyncio

import pytest

from app.errors import (
    InvalidInputError,
    InvalidOutputError,
    PermanentError,
    ProviderRefusedError,
    TransientError,
)
from app.metrics import WorkerMetrics
from app.service.circuit_breaker import BreakerState, CircuitBreaker


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


def held(release: asyncio.Event, entered: asyncio.Event, outcome: Exception | None, calls):
    async def operation():
        calls.append(1)
        entered.set()
        await release.wait()
        if outcome is not None:
            raise outcome
        return "ok"

    return operation


def _circuit_open(metrics: WorkerMetrics) -> float | None:
    return metrics.registry.get_sample_value("pinlog_circuit_open", {"provider": "embedding"})


async def open_breaker(breaker: CircuitBreaker, threshold: int) -> None:
    for _ in range(threshold):
        with pytest.raises(ProviderRefusedError):
            await breaker.call(failing(ProviderRefusedError("embedding upstream 401"), []))
    assert breaker.state is BreakerState.OPEN


async def test_opens_after_threshold_refusals_and_stops_calling_until_cooldown():
    clock, calls = Clock(), []
    breaker = CircuitBreaker(
        "embedding provider", metrics=WorkerMetrics(), threshold=3, cooldown_seconds=60, clock=clock
    )
    operation = failing(ProviderRefusedError("embedding upstream 401"), calls)

    for _ in range(3):
        with pytest.raises(ProviderRefusedError):
            await breaker.call(operation)
    for _ in range(2):
        with pytest.raises(TransientError, match="circuit open"):
            await breaker.call(operation)

    assert len(calls) == 3
    assert breaker.state is BreakerState.OPEN
    clock.now = 61
    assert breaker.state is BreakerState.HALF_OPEN


@pytest.mark.parametrize("probe_outcome", ["refused", "success", "input_error", "transient"])
async def test_half_open_lets_exactly_one_of_four_concurrent_calls_through(probe_outcome):
    """Issue 7 item 1a: after the cooldown, four concurrent callers; one probes, three get
    ``TransientError`` without calling. Refused: open again (one more ``FAILED`` per
    cooldown); success or an input error: closed; transient: still half-open, slot free."""
    clock, calls, metrics = Clock(), [], WorkerMetrics()
    breaker = CircuitBreaker(
        "embedding provider", metrics=metrics, threshold=2, cooldown_seconds=60, clock=clock
    )
    await open_breaker(breaker, 2)
    assert _circuit_open(metrics) == 1
    clock.now = 60
    outcome = {
        "refused": ProviderRefusedError("embedding upstream 401"),
        "success": None,
        "input_error": PermanentError("embedding upstream 400"),
        "transient": TransientError("embedding upstream 503"),
    }[probe_outcome]
    release, entered = asyncio.Event(), asyncio.Event()
    probe = asyncio.create_task(breaker.call(held(release, entered, outcome, calls)))
    await entered.wait()
    others = [breaker.call(held(release, asyncio.Event(), None, calls)) for _ in range(3)]
    results = await asyncio.gather(*others, return_exceptions=True)
    release.set()
    probe_result = await asyncio.gather(probe, return_exceptions=True)

    assert len(calls) == 1
    assert all(isinstance(r, TransientError) and "probe in flight" in str(r) for r in results)
    expected_state = {
        "refused": BreakerState.OPEN,
        "success": BreakerState.CLOSED,
        "input_error": BreakerState.CLOSED,
        "transient": BreakerState.HALF_OPEN,
    }[probe_outcome]
    assert breaker.state is expected_state
    # The gauge reads 1 while open or half-open, 0 once closed.
    assert _circuit_open(metrics) == (0 if expected_state is BreakerState.CLOSED else 1)
    if outcome is None:
        assert probe_result == ["ok"]
    else:
        assert probe_result == [outcome]  # the probe's own error, unchanged


async def test_refusals_arriving_after_another_call_opened_it_are_transient():
    """Threshold 1 and three calls in flight: the first refusal opens the breaker and is
    permanent; the two that land afterwards are ``TransientError`` (left for the rescan)."""
    breaker = CircuitBreaker(
        "judge provider", metrics=WorkerMetrics(), threshold=1, cooldown_seconds=60
    )
    release, calls = asyncio.Event(), []
    refused = ProviderRefusedError("judge upstream 401")
    entered = [asyncio.Event() for _ in range(3)]
    tasks = [
        asyncio.create_task(breaker.call(held(release, event, refused, calls))) for event in entered
    ]
    for event in entered:
        await event.wait()
    release.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)

    assert len(calls) == 3
    assert results[0] is refused
    assert all(isinstance(r, TransientError) and "circuit open" in str(r) for r in results[1:])


@pytest.mark.parametrize(
    "error",
    [
        PermanentError("embedding upstream 400"),  # context_length_exceeded, content filter
        InvalidInputError("text is blank after normalisation"),
        InvalidOutputError("judge output invalid"),
        PermanentError("judge refused"),
        TransientError("embedding upstream 503"),
    ],
    ids=["400", "invalid-input", "invalid-output", "refusal", "transient"],
)
async def test_input_specific_and_transient_errors_never_open_it(error):
    """Issue 7 item 1b: five errors about one input each (threshold 1) leave it closed."""
    breaker = CircuitBreaker(
        "embedding provider", metrics=WorkerMetrics(), threshold=1, cooldown_seconds=60
    )
    for _ in range(5):
        with pytest.raises(type(error)):
            await breaker.call(failing(error, []))
    assert breaker.state is BreakerState.CLOSED


async def test_an_input_error_between_refusals_resets_the_count():
    breaker = CircuitBreaker(
        "embedding provider", metrics=WorkerMetrics(), threshold=2, cooldown_seconds=60
    )
    refused = failing(ProviderRefusedError("embedding upstream 401"), [])
    with pytest.raises(ProviderRefusedError):
        await breaker.call(refused)
    with pytest.raises(PermanentError):
        await breaker.call(failing(PermanentError("embedding upstream 400"), []))
    with pytest.raises(ProviderRefusedError):
        await breaker.call(refused)
    assert breaker.state is BreakerState.CLOSED
