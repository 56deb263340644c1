"""Stops a storm of provider-wide refusals from failing every context (§6).

Closed: calls pass; ``threshold`` consecutive provider-wide refusals (``failure_policy.
counts_against_provider``: 401, 403, 404, wrong dimension) open it. Each of those is still
permanent for its own context; a refusal that arrives after another call opened the breaker
is turned into ``TransientError``, so exactly ``threshold`` contexts end ``FAILED``.
Open: for ``cooldown_seconds`` no call is made; every attempt raises ``TransientError`` and
the stage stays ``PROCESSING`` for the rescan.
Half-open (after the cooldown): exactly one call goes through as the probe; concurrent calls
raise ``TransientError`` without calling. A refused probe reopens it for another cooldown
(one more ``FAILED`` context per cooldown at most); a success, or an error about one input
(the provider did accept the key and the model), closes it; a transient error or a
cancellation frees the probe slot for the next call.

Input-specific errors (context length, content filter, refusal, invalid output, bad input)
never count. Ours rather than a library's: the maintained asyncio breakers we looked at
(purgatory, aiobreaker) count exceptions by type with one failure counter and let every
caller through in half-open, which is the fault this class exists to prevent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from enum import StrEnum
from typing import TypeVar

from app import failure_policy
from app.errors import PermanentError, TransientError
from app.metrics import WorkerMetrics

logger = logging.getLogger(__name__)
T = TypeVar("T")


class BreakerState(StrEnum):
    """Where a breaker stands; ``HALF_OPEN`` follows ``OPEN`` by time alone (the cooldown)."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


class CircuitBreaker:
    """One provider's breaker. ``name`` (e.g. ``"embedding provider"``) appears in messages,
    without `` provider`` as the ``provider`` label of ``pinlog_circuit_open`` in ``metrics``;
    ``cooldown_seconds`` is measured with ``clock`` (seconds, monotonic)."""

    def __init__(
        self,
        name: str,
        *,
        metrics: WorkerMetrics,
        threshold: int,
        cooldown_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._name = name
        self._threshold = threshold
        self._cooldown_seconds = cooldown_seconds
        self._clock = clock
        self._consecutive = 0
        self._opened_at: float | None = None
        self._probing = False
        self._open_gauge = metrics.circuit_open.labels(name.removesuffix(" provider"))
        self._open_gauge.set(0)

    @property
    def state(self) -> BreakerState:
        """The state now, read from the clock: no timer runs in the background."""
        if self._opened_at is None:
            return BreakerState.CLOSED
        if self._clock() - self._opened_at < self._cooldown_seconds:
            return BreakerState.OPEN
        return BreakerState.HALF_OPEN

    @property
    def is_open(self) -> bool:
        """True while calls are refused without trying (open, not yet half-open)."""
        return self.state is BreakerState.OPEN

    async def call(self, operation: Callable[[], Awaitable[T]]) -> T:
        """Run ``operation`` under the rules of the module docstring.

        Raises ``TransientError`` instead of calling while open or while another call probes;
        otherwise whatever ``operation`` raises (a late provider-wide refusal: transient).
        """
        state = self.state
        if state is BreakerState.OPEN:
            raise TransientError(f"{self._name} circuit open")
        probe = state is BreakerState.HALF_OPEN
        if probe:
            if self._probing:
                raise TransientError(f"{self._name} circuit half-open, probe in flight")
            self._probing = True
        try:
            result = await operation()
        except PermanentError as exc:
            if failure_policy.counts_against_provider(exc):
                if not self._refused(probe):
                    raise TransientError(f"{self._name} circuit open") from None
            else:
                self._close()  # the provider accepted key and model; this input was bad
            raise
        finally:
            if probe:
                self._probing = False
        self._close()
        return result

    def _refused(self, probe: bool) -> bool:
        """Record a provider-wide refusal; False when another call had opened it already."""
        if self._opened_at is not None and not probe:
            return False
        self._consecutive += 1
        if probe:
            logger.warning("%s circuit probe refused, open again", self._name)
        elif self._consecutive >= self._threshold:
            logger.error(
                "%s circuit opened after %d consecutive provider-wide errors",
                self._name,
                self._consecutive,
            )
        else:
            return True
        self._opened_at = self._clock()
        self._open_gauge.set(1)
        return True

    def _close(self) -> None:
        self._consecutive = 0
        if self._opened_at is not None:
            self._opened_at = None
            self._open_gauge.set(0)
            logger.info("%s circuit closed", self._name)
