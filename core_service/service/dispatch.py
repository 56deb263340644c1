"""The core's dispatcher: process requests to the workers, counted, refusals retried (§9).

A dispatch is never part of a transaction and never blocks a client request: after a commit it
runs in the background (``dispatch_soon``); the rescan awaits its own (``dispatch``). What a
dispatch does with each outcome (``process_requests``, docs/rescan.md "Budget"):

- **taken** (``202``, a timeout after sending, a verdict such as ``422``): counted in its own
  statement after the answer (the context's first free, each later one spends a retry);
- **refused** (``503``, unreachable): nothing written; the gate closes for the workers'
  ``Retry-After`` (or the backoff) and the request waits in the bounded, fair retry set
  (``retry_set``), from which this dispatcher's loop sends it again once the gate opens. While
  the gate is closed, new dispatches join the set without being sent (result ``held``);
- **unauthorized** (``401``/``403``): an ERROR line; nothing written; the rescan tries later.

While dispatching is paused (``service/pause.py``), nothing is sent: every dispatch is held.

A request leaves the set once it has waited most of the pending expiry (the rescan owns the
row again); one that finds the set full, or leaves it, is written as due for the rescan
(``next_dispatch_at``) and wakes the rescan loop (``rescan_wanted``). At shutdown the set is
dropped: its rows are still ``PENDING``. Log lines name context ids and error classes, never
the note.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.errors import CoreError
from core_service.metrics import CoreMetrics
from core_service.repository import context_ai_state
from core_service.repository.db import autocommit
from core_service.service.pause import PauseSwitch
from core_service.service.process_requests import (
    DispatchOutcome,
    DispatchRequest,
    DispatchResult,
    ProcessRequestSender,
)
from core_service.service.retry_set import RefusalGate, RetrySet
from pinlog_platform import tracing
from pinlog_platform.logging import log_context

__all__ = ["DispatchOutcome", "DispatchRequest", "DispatchResult", "WorkerDispatcher"]

logger = logging.getLogger(__name__)

# Held requests the retry loop sends at once when the gate opens.
RETRY_CONCURRENCY = 8
# A held request leaves the set after this share of the pending expiry, so that it is gone
# before the rescan of any core process may take its row by the expiry rule.
HOLD_SHARE_OF_PENDING_EXPIRY = 0.9
# The retry loop looks for expired requests at least this often (seconds).
EXPIRY_CHECK_SECONDS = 1.0
# How often a rescan waiting for the retry set to empty looks again (seconds).
READY_POLL_SECONDS = 0.1


class WorkerDispatcher:
    """Sends process requests, counts the ones a worker took and retries refused ones from a
    bounded in-process set (module docstring). ``start`` its loop; ``close`` at shutdown."""

    def __init__(
        self,
        sender: ProcessRequestSender,
        metrics: CoreMetrics,
        engine: AsyncEngine,
        *,
        max_retry: int,
        pending_expiry_seconds: float,
        retry_capacity: int,
        backoff_max_seconds: float,
        pause: PauseSwitch | None = None,
    ) -> None:
        self._sender = sender
        self._pause = pause
        self._metrics = metrics
        self._engine = engine
        self._max_retry = max_retry
        self._hold_seconds = pending_expiry_seconds * HOLD_SHARE_OF_PENDING_EXPIRY
        self._held = RetrySet(retry_capacity)
        self._gate = RefusalGate(backoff_max_seconds=backoff_max_seconds)
        self._let_go: set[int] = set()  # context ids to hand to the rescan
        self._work = asyncio.Event()  # the loop has something to do
        self.rescan_wanted = asyncio.Event()  # rows were let go: the rescan should run now
        self._in_flight: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.Task[None] | None = None
        metrics.retry_set_size.set_function(lambda: len(self._held))

    @property
    def room(self) -> int:
        """How many more refused requests the retry set can hold."""
        return self._held.room

    def seconds_until_open(self) -> float:
        """0 when the workers may be asked now, else the seconds the gate stays closed."""
        return self._gate.seconds_until_open()

    async def paused(self, *, strict: bool = False) -> bool:
        """Dispatching is paused (``pinlog-core pause``; the state at most 1 s old).
        ``strict``: a database fault raises ``UnavailableError`` (``PauseSwitch.paused``)."""
        return self._pause is not None and await self._pause.paused(strict=strict)

    @property
    def ready(self) -> bool:
        """Nothing waits: the gate is open and the retry set empty (the rescan may claim)."""
        return self._gate.is_open and not self._held

    async def wait_until_ready(self, timeout_seconds: float, stop: asyncio.Event) -> None:
        """Return once ``ready`` (or ``stop`` is set, or after ``timeout_seconds``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_seconds
        while not self.ready and not stop.is_set():
            left = deadline - loop.time()
            if left <= 0:
                return
            wait = max(self._gate.seconds_until_open(), READY_POLL_SECONDS)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), min(wait, left))

    async def dispatch(self, request: DispatchRequest, *, origin: str) -> DispatchOutcome:
        """Send one request now (or hold it while the gate is closed) and settle the outcome;
        never raises for worker, network or database faults (they are logged).

        ``origin`` labels the metric: ``commit`` (after a create or edit) or ``rescan``.
        """
        with (
            log_context(context_id=request.context_id),
            tracing.span("dispatch", context_id=request.context_id, origin=origin),
        ):
            if self._gate.is_open and not await self.paused():
                outcome = await self._sender.send(request)
            else:
                outcome = DispatchOutcome(DispatchResult.HELD)
            self._metrics.dispatches.labels(origin, outcome.result.value).inc()
            await self._settle(request, outcome)
            if outcome.result.retry_later:
                self._hold(request)
        return outcome

    def dispatch_soon(self, request: DispatchRequest) -> None:
        """Start ``dispatch`` in the background (after a commit) and return at once."""
        task = asyncio.create_task(self.dispatch(request, origin="commit"))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    def start(self) -> None:
        """Start the retry loop (the service's lifespan; commands that send once need none)."""
        if self._loop is None:
            self._loop = asyncio.create_task(self._run())

    async def drain(self, timeout_seconds: float) -> None:
        """Wait up to ``timeout_seconds`` for background dispatches, then cancel the rest
        (their contexts stay ``PENDING``)."""
        if not self._in_flight:
            return
        _done, pending = await asyncio.wait(set(self._in_flight), timeout=timeout_seconds)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def close(self, timeout_seconds: float) -> None:
        """Shutdown: stop the loop, drain background dispatches, drop the retry set (its rows
        are still ``PENDING``; the rescan of any core process re-requests them)."""
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
            self._loop = None
        await self.drain(timeout_seconds)
        dropped = self._held.clear()
        if dropped:
            logger.info("shutdown: %d held dispatch(es) left PENDING for the rescan", dropped)

    async def _settle(self, request: DispatchRequest, outcome: DispatchOutcome) -> None:
        """Count, log and pace by one outcome (module docstring)."""
        for base_url in outcome.unauthorized:
            logger.error(
                "worker %s refused our X-Internal-Secret (401/403): PINLOG_CORE_INTERNAL_SECRET "
                "must equal the worker's PINLOG_INTERNAL_SECRET; context %d not counted",
                base_url,
                request.context_id,
            )
        result, causes = outcome.result, ", ".join(outcome.causes)
        if result.ran:
            self._gate.accepted()
            if result is not DispatchResult.ACCEPTED:
                logger.warning("dispatch of context %d: %s (%s); counted", request.context_id,
                               _TAKEN_WORDS[result], causes)  # fmt: skip
            elif len(outcome.causes) > 1:
                logger.info("dispatch of context %d skipped %d worker(s) (%s)",
                            request.context_id, len(outcome.causes) - 1, causes)  # fmt: skip
            await self._count(request.context_id, outcome)
        elif result in (DispatchResult.REFUSED, DispatchResult.UNREACHABLE):
            waiting = self._gate.refused(outcome.retry_after_seconds)
            logger.warning(
                "dispatch of context %d not taken (%s); tried again in %.1f s",
                request.context_id,
                causes,
                waiting,
            )

    async def _count(self, context_id: int, outcome: DispatchOutcome) -> None:
        """The counting statement after a dispatch that ran (docs/rescan.md "Budget"), which
        also records its worker and outcome (``pinlog-core inspect``)."""
        try:
            async with autocommit(self._engine) as conn:
                await context_ai_state.record_accepted_dispatch(
                    conn,
                    context_id=context_id,
                    max_retry=self._max_retry,
                    worker=outcome.taken_by,
                    outcome=outcome.recorded_outcome,
                )
        except CoreError as exc:
            logger.warning(
                "dispatch of context %d was taken but could not be counted (%s)",
                context_id,
                type(exc).__name__,
            )

    def _hold(self, request: DispatchRequest) -> None:
        if tracing.enabled() and request.trace_context is None:
            # The retry loop's send continues this dispatch's trace.
            request = dataclasses.replace(request, trace_context=tracing.current_context())
        if not self._held.add(request, hold_seconds=self._hold_seconds):
            self._let_go_of([request], reason="overflow")
        self._work.set()

    def _let_go_of(self, requests: list[DispatchRequest], *, reason: str) -> None:
        """Requests the set cannot keep: written as due for the rescan by the loop."""
        self._let_go.update(request.context_id for request in requests)
        self._metrics.dispatches_let_go.labels(reason).inc(len(requests))
        self._work.set()

    async def _run(self) -> None:
        """The retry loop: expire, write what was let go, then send held requests in fair
        order while the gate is open."""
        while True:
            try:
                expired = self._held.expire()
                if expired:
                    self._let_go_of(expired, reason="expired")
                await self._write_let_go()
                if not self._held:
                    self._work.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._work.wait(), EXPIRY_CHECK_SECONDS)
                elif not self._gate.is_open:
                    await asyncio.sleep(min(self._gate.seconds_until_open(), EXPIRY_CHECK_SECONDS))
                elif await self.paused():
                    await asyncio.sleep(EXPIRY_CHECK_SECONDS)
                else:
                    await self._send_held(self._held.take(RETRY_CONCURRENCY))
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("dispatch retry loop failed; continuing")
                await asyncio.sleep(EXPIRY_CHECK_SECONDS)

    async def _send_held(self, taken: list[tuple[DispatchRequest, float]]) -> None:
        async def one(request: DispatchRequest) -> DispatchOutcome:
            with (
                log_context(context_id=request.context_id),
                tracing.span(
                    "dispatch",
                    parent=request.trace_context,
                    context_id=request.context_id,
                    origin="retry",
                ),
            ):
                outcome = await self._sender.send(request)
                self._metrics.dispatches.labels("retry", outcome.result.value).inc()
                await self._settle(request, outcome)
                return outcome

        outcomes = await asyncio.gather(*(one(request) for request, _ in taken))
        again = [held for held, o in zip(taken, outcomes, strict=True) if o.result.retry_later]
        if again:
            rejected = self._held.put_back(again)
            if rejected:
                self._let_go_of(rejected, reason="expired")

    async def _write_let_go(self) -> None:
        """One statement for everything let go since the last pass, due for the rescan once
        the gate opens; then wake the rescan. A database fault keeps them for the next pass
        (they are ``PENDING`` either way)."""
        if not self._let_go:
            return
        try:
            async with autocommit(self._engine) as conn:
                await context_ai_state.defer_dispatch(
                    conn, sorted(self._let_go), delay_seconds=self._gate.seconds_until_open()
                )
        except CoreError as exc:
            logger.warning("could not hand %d context(s) to the rescan (%s)",
                           len(self._let_go), type(exc).__name__)  # fmt: skip
            return
        logger.info("handed %d context(s) to the rescan", len(self._let_go))
        self._let_go.clear()
        self.rescan_wanted.set()


_TAKEN_WORDS = {
    DispatchResult.TIMED_OUT: "timed out after it was sent",
    DispatchResult.REJECTED: "rejected by the worker",
}
