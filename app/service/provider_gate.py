"""The one place that decides "provider unavailable" (§6 with its deviation).

One gate per provider (``embedding``, ``judge``). Closed: calls pass. ``threshold``
consecutive faults that ``failure_policy.counts_against_provider`` (provider-wide answers,
protocol faults, a vector of the wrong dimension) close it to traffic ("the circuit opens"),
whatever their status code; a success, or an answer about one input (the provider accepted
key, model and parameters), resets the count; transient answers (rate limits, 5xx, timeouts)
neither count nor reset. After the first counted fault, calls go through one at a time until
the count resets or the gate opens, so a storm costs at most ``threshold`` provider calls
plus the calls already in flight when it began.

Open: no call is made; ``call`` raises ``ProviderGateClosed`` (transient: the stage stays
``PROCESSING``), the worker refuses process requests (and search, for the embedding gate) with
``Retry-After`` = ``retry_after_seconds()``, the time until the next probe. The worker probes
on its own timer, one probe per cooldown, never with a user's note: ``probe`` is the same kind
of call that failed (an embedding of a fixed text, a judge call with a fixed note and
candidate and the production parameters; ``service/provider_probes.py``). A probe that
succeeds, or whose answer is about its input, closes the gate ("available" again); any other
outcome keeps it open for another cooldown.

A 429 rate limit (``cooldown``: the seconds left of the provider's rate-budget cooldown,
``providers/rate_budget.py``) makes it unavailable with reason ``rate_limited`` for those
seconds: process requests are refused with that ``Retry-After``, calls already accepted are
delayed by the budget, not refused. A daily token cap (``spend_cap``,
``service/spend_guard.py``) is one more reason: while it is reached the gate is unavailable
with reason ``daily_token_cap`` and a ``Retry-After`` of the seconds to the next UTC day,
whatever the circuit says; no probe runs for it. ``/readyz``, the routes and the stages keep
asking one object. Gauge ``pinlog_circuit_open{provider}``: 1
while the circuit is open; ``pinlog_provider_spend_capped{provider}``: 1 while capped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client import Counter

from app import failure_policy
from app.errors import PermanentError, ProviderGateClosed
from app.metrics import WorkerMetrics
from app.service.spend_guard import REASON as SPEND_CAP_REASON
from app.service.spend_guard import DailyTokenCap

logger = logging.getLogger(__name__)
T = TypeVar("T")

RATE_LIMITED_REASON = "rate_limited"
# Seconds between probes at least, whatever the cooldown (a cooldown of 0 must not spin).
MIN_PROBE_INTERVAL_SECONDS = 0.1


@dataclass(frozen=True, slots=True)
class ProcessRefusal:
    """Why a process request is refused: the unavailable providers (``"judge"``,
    ``"embedding and judge"``) and the ``Retry-After`` in whole seconds (the latest of their
    waits)."""

    providers: str
    retry_after_seconds: int


@dataclass(frozen=True, slots=True)
class ProviderRefusalPolicy:
    """Whether process requests are refused while a provider is unavailable
    (``Settings.refuse_while_provider_unavailable``), the gates deciding it, and the counter
    of those refusals
    (``pinlog_process_requests_rejected_total{reason="provider_unavailable"}``)."""

    enabled: bool
    counter: Counter
    gates: Mapping[str, ProviderGate]

    def refusal(self) -> ProcessRefusal | None:
        """The refusal for a process request now (counted), or ``None`` to accept it: never
        202 for work that will not run."""
        if not self.enabled:
            return None
        unavailable = [(name, gate) for name, gate in self.gates.items() if not gate.available]
        if not unavailable:
            return None
        self.counter.inc()
        return ProcessRefusal(
            providers=" and ".join(name for name, _ in unavailable),
            retry_after_seconds=max(gate.retry_after_seconds() or 1 for _, gate in unavailable),
        )


class ProviderGate:
    """One provider's gate. ``name``: ``"embedding"`` or ``"judge"`` (the metric label and the
    ``/readyz`` key); ``cooldown_seconds``: seconds between probes, measured with ``clock``
    (monotonic); ``probe``: the synthetic call (module docstring)."""

    def __init__(
        self,
        name: str,
        *,
        metrics: WorkerMetrics,
        threshold: int,
        cooldown_seconds: float,
        probe: Callable[[], Awaitable[object]],
        clock: Callable[[], float] = time.monotonic,
        spend_cap: DailyTokenCap | None = None,
        cooldown: Callable[[], float] | None = None,
    ) -> None:
        self.name = name
        self._spend_cap = spend_cap
        self._cooldown = cooldown
        self._threshold = threshold
        self._interval = max(cooldown_seconds, MIN_PROBE_INTERVAL_SECONDS)
        self._probe = probe
        self._clock = clock
        self._consecutive = 0
        self._reason: str | None = None  # of the fault that opened it, while open
        self._next_probe_at: float | None = None  # None while closed
        self._one_at_a_time = asyncio.Lock()
        self._prober: asyncio.Task[None] | None = None
        self._open_gauge = metrics.circuit_open.labels(name)
        self._open_gauge.set(0)

    @property
    def available(self) -> bool:
        """False while the gate is open (calls refused until a probe succeeds) or the daily
        token cap is reached."""
        return self._next_probe_at is None and not self._capped() and not self._cooling()

    @property
    def reason(self) -> str | None:
        """While unavailable, ``daily_token_cap`` or the reason label of the fault that
        opened it (``failure_policy.PROVIDER_WIDE_REASONS``); ``None`` while available."""
        if self._capped():
            return SPEND_CAP_REASON
        if self._reason is None and self._cooling():
            return RATE_LIMITED_REASON
        return self._reason

    def retry_after_seconds(self) -> int | None:
        """Whole seconds (at least 1) until the next probe while open, or until the next UTC
        day while capped (the later of both); ``None`` while available."""
        waits = []
        if self._next_probe_at is not None:
            waits.append(max(1, math.ceil(self._next_probe_at - self._clock())))
        if self._spend_cap is not None and self._capped():
            waits.append(self._spend_cap.retry_after_seconds())
        if self._cooldown is not None and (cooling := self._cooldown()) > 0:
            waits.append(max(1, math.ceil(cooling)))
        return max(waits) if waits else None

    def _capped(self) -> bool:
        return self._spend_cap is not None and self._spend_cap.reached()

    def _cooling(self) -> bool:
        return self._cooldown is not None and self._cooldown() > 0

    def _refuse_while_open(self) -> None:
        """Refuses while the circuit is open or the cap is reached; a 429 cooldown refuses
        nothing here (the rate budget delays the call instead)."""
        waits = []
        if self._next_probe_at is not None:
            waits.append(max(1, math.ceil(self._next_probe_at - self._clock())))
        if self._spend_cap is not None and self._capped():
            waits.append(self._spend_cap.retry_after_seconds())
        if waits:
            raise ProviderGateClosed(
                f"{self.name} provider unavailable", retry_after_seconds=max(waits)
            )

    async def call(self, operation: Callable[[], Awaitable[T]]) -> T:
        """Run ``operation`` under the rules of the module docstring; raises
        ``ProviderGateClosed`` without calling while open, otherwise what ``operation``
        raises."""
        self._refuse_while_open()
        if self._consecutive == 0:
            return await self._counted(operation)
        async with self._one_at_a_time:
            self._refuse_while_open()
            return await self._counted(operation)

    async def aclose(self) -> None:
        """Stop the probe timer (shutdown)."""
        if self._prober is not None:
            self._prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._prober
            self._prober = None

    async def _counted(self, operation: Callable[[], Awaitable[T]]) -> T:
        try:
            result = await operation()
        except Exception as exc:
            if failure_policy.counts_against_provider(exc):
                self._fault(failure_policy.gate_reason(exc))
            elif isinstance(exc, PermanentError):
                self._consecutive = 0  # the provider answered about this input
            raise
        self._consecutive = 0
        return result

    def _fault(self, reason: str) -> None:
        self._consecutive += 1
        if self._consecutive < self._threshold or not self.available:
            return
        self._reason = reason
        self._next_probe_at = self._clock() + self._interval
        self._open_gauge.set(1)
        logger.error(
            "%s provider unavailable after %d consecutive provider-wide faults: reason=%s; "
            "probing every %g s",
            self.name,
            self._consecutive,
            reason,
            self._interval,
        )
        self._prober = asyncio.create_task(self._probe_until_available(), name=f"{self.name}-probe")

    async def _probe_until_available(self) -> None:
        while self._next_probe_at is not None:
            await asyncio.sleep(max(self._next_probe_at - self._clock(), 0))
            try:
                await self._probe()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not failure_policy.counts_against_provider(exc) and isinstance(
                    exc, PermanentError
                ):
                    self._close("probe answered about its input")
                    return
                if failure_policy.counts_against_provider(exc):
                    self._reason = failure_policy.gate_reason(exc)
                logger.warning(
                    "%s provider probe failed, still unavailable: cause=%s reason=%s",
                    self.name,
                    type(exc).__name__,
                    self._reason,
                )
                self._next_probe_at = self._clock() + self._interval
                continue
            self._close("probe succeeded")
            return

    def _close(self, why: str) -> None:
        self._consecutive = 0
        self._reason = None
        self._next_probe_at = None
        self._open_gauge.set(0)
        self._prober = None
        logger.warning("%s provider available again: %s", self.name, why)
