"""The provider gate: provider-wide faults count, whatever their status; after the
threshold the gate opens, refuses calls without calling, and probes on its own timer.

Concurrency is real (asyncio tasks) and driven by events; cooldowns are the gate's minimum
probe interval (0.1 s), so probes run without sleeping long.
"""

from __future__ import annotations

import asyncio

import pytest

from app.errors import (
    DimensionMismatchError,
    InvalidInputError,
    InvalidOutputError,
    ProviderGateClosed,
    ProviderProtocolError,
    ProviderUnavailableError,
    TransientError,
)
from app.metrics import WorkerMetrics
from app.service.provider_gate import ProviderGate


def quota() -> ProviderUnavailableError:
    return ProviderUnavailableError(
        "embedding upstream 429: provider-wide (quota)",
        layer="embedding",
        reason="quota",
        status=429,
        code="insufficient_quota",
        error_type="insufficient_quota",
    )


def failing(error: Exception, calls: list[int]):
    async def operation():
        calls.append(1)
        raise error

    return operation


async def succeeding() -> str:
    return "ok"


class Probe:
    """A probe whose outcome the test sets; counts its calls and signals each one."""

    def __init__(self, outcome: Exception | None) -> None:
        self.outcome = outcome
        self.calls = 0
        self.called = asyncio.Event()

    async def __call__(self) -> str:
        self.calls += 1
        self.called.set()
        if self.outcome is not None:
            raise self.outcome
        return "ok"

    async def next_call(self) -> None:
        self.called.clear()
        await asyncio.wait_for(self.called.wait(), timeout=5)


def _circuit_open(metrics: WorkerMetrics, provider: str = "embedding") -> float | None:
    return metrics.registry.get_sample_value("pinlog_circuit_open", {"provider": provider})


def gate(probe: Probe, *, threshold: int = 3, metrics: WorkerMetrics | None = None, cooldown=0):
    return ProviderGate(
        "embedding",
        metrics=metrics or WorkerMetrics(),
        threshold=threshold,
        cooldown_seconds=cooldown,
        probe=probe,
    )


async def test_threshold_provider_wide_faults_open_it_and_later_calls_are_refused_uncalled():
    metrics, calls, probe = WorkerMetrics(), [], Probe(quota())
    subject = gate(probe, metrics=metrics, cooldown=60)
    for _ in range(3):
        with pytest.raises(ProviderUnavailableError):  # transient: the stage stays PROCESSING
            await subject.call(failing(quota(), calls))
    for _ in range(2):
        with pytest.raises(ProviderGateClosed) as refused:
            await subject.call(failing(quota(), calls))

    assert len(calls) == 3
    assert not subject.available
    assert subject.reason == "quota"
    assert 59 <= refused.value.retry_after_seconds <= 60
    assert subject.retry_after_seconds() == refused.value.retry_after_seconds
    assert _circuit_open(metrics) == 1
    assert probe.calls == 0  # the first probe waits one cooldown
    await subject.aclose()


@pytest.mark.parametrize(
    "fault",
    [
        quota(),
        ProviderProtocolError("embedding provider returned a malformed body", layer="embedding"),
        DimensionMismatchError("embedding dimension mismatch: expected 1536, got 1024"),
    ],
    ids=["provider-wide", "protocol", "dimension"],
)
async def test_every_counted_kind_opens_it_and_keeps_its_own_class(fault):
    """A wrong dimension counts but stays permanent (``FAILED`` for its note, §5)."""
    subject = gate(Probe(fault), threshold=2, cooldown=60)
    for _ in range(2):
        with pytest.raises(type(fault)):
            await subject.call(failing(fault, []))
    assert not subject.available
    await subject.aclose()


@pytest.mark.parametrize(
    "error",
    [
        InvalidInputError("embedding upstream 400: text is longer than the model accepts"),
        InvalidOutputError("judge output invalid"),
        TransientError("embedding upstream 503"),
    ],
    ids=["input", "invalid-output", "transient"],
)
async def test_input_and_transient_errors_never_open_it(error):
    subject = gate(Probe(None), threshold=1)
    for _ in range(5):
        with pytest.raises(type(error)):
            await subject.call(failing(error, []))
    assert subject.available


async def test_a_success_or_an_input_error_between_faults_resets_the_count():
    subject = gate(Probe(None), threshold=2)
    with pytest.raises(ProviderUnavailableError):
        await subject.call(failing(quota(), []))
    with pytest.raises(InvalidInputError):
        await subject.call(failing(InvalidInputError("embedding upstream 400"), []))
    with pytest.raises(ProviderUnavailableError):
        await subject.call(failing(quota(), []))
    assert await subject.call(succeeding) == "ok"
    with pytest.raises(ProviderUnavailableError):
        await subject.call(failing(quota(), []))
    assert subject.available


async def test_after_a_fault_calls_go_one_at_a_time_so_a_storm_costs_threshold_calls():
    """Eight concurrent stages after one fault, threshold 3: two more calls reach the
    provider, one at a time; the gate opens and the other five are refused uncalled."""
    subject, calls = gate(Probe(quota()), threshold=3, cooldown=60), []
    in_flight = peak = 0

    async def operation():
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        calls.append(1)
        await asyncio.sleep(0.01)
        in_flight -= 1
        raise quota()

    with pytest.raises(ProviderUnavailableError):
        await subject.call(operation)
    results = await asyncio.gather(
        *(subject.call(operation) for _ in range(8)), return_exceptions=True
    )

    assert len(calls) == 3
    assert peak == 1
    assert sum(isinstance(r, ProviderGateClosed) for r in results) == 6
    await subject.aclose()


async def test_the_probe_runs_on_its_own_timer_and_a_success_closes_it():
    metrics, probe = WorkerMetrics(), Probe(quota())
    subject = gate(probe, threshold=1, metrics=metrics)
    with pytest.raises(ProviderUnavailableError):
        await subject.call(failing(quota(), []))
    await probe.next_call()  # failed: still open, probing again one cooldown later
    await probe.next_call()
    assert not subject.available
    probe.outcome = None
    await probe.next_call()
    await asyncio.sleep(0)

    assert subject.available
    assert subject.reason is None and subject.retry_after_seconds() is None
    assert _circuit_open(metrics) == 0
    assert await subject.call(succeeding) == "ok"
    await subject.aclose()


@pytest.mark.parametrize(
    "outcome",
    [InvalidOutputError("judge output invalid"), TransientError("embedding upstream 503")],
    ids=["answered-about-its-input", "transient"],
)
async def test_a_probe_answer_about_its_input_closes_it_a_transient_one_does_not(outcome):
    probe = Probe(outcome)
    subject = gate(probe, threshold=1)
    with pytest.raises(ProviderUnavailableError):
        await subject.call(failing(quota(), []))
    await probe.next_call()
    await asyncio.sleep(0)
    assert subject.available is isinstance(outcome, InvalidOutputError)
    await subject.aclose()


async def test_a_failed_probe_keeps_the_reason_of_its_own_fault():
    probe = Probe(
        ProviderUnavailableError("e", layer="embedding", reason="authentication", status=401)
    )
    subject = gate(probe, threshold=1)
    with pytest.raises(ProviderUnavailableError):
        await subject.call(failing(quota(), []))
    assert subject.reason == "quota"
    await probe.next_call()
    await asyncio.sleep(0)
    assert subject.reason == "authentication"
    await subject.aclose()
    calls_at_close = probe.calls
    await asyncio.sleep(0.25)
    assert probe.calls == calls_at_close  # aclose stopped the timer
