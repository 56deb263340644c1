"""The rescan scheduler and the finalizer (§9 "Rescan scheduler"), ``run_once`` plus a loop.

Each run: (1) finalize: close keyword stages that can never run (embedding ``FAILED``), then
fail the unfinished stages of stale rows whose retries are spent; (2) claim stale rows with
retries left (``FOR UPDATE SKIP LOCKED``), stamp ``rescanned_at``, commit; (3) re-read each
claimed context in core; (4) skip deleted ones (WARNING when their state is not
``CANCELLED``); (5) dispatch the rest through the normal entry point and wait for the answers.
A retry is spent only by a dispatch a worker took (``WorkerDispatcher``, docs/rescan.md
"Budget"), never by the claim.

The pass claims only while this process's dispatcher has nothing waiting (its gate is open
and its retry set empty): refused work waits in the set, not in more claims. The loop runs
again as soon as the workers take more while a pass finds a full batch (a backlog drains at
the workers' speed), when the dispatcher hands rows back (``rescan_wanted``), and otherwise
every ``period_seconds`` (docs/rescan.md "Backlog"). While dispatching is paused, a pass does
nothing at all, and the loop looks again every second.

Safe with several instances at once: claims skip rows locked by another instance, and a row
just claimed carries a fresh ``rescanned_at``, so it is not claimed again until the expiry has
passed once more (docs/rescan.md explains why ``updated_at`` is left to the worker).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.errors import UnavailableError
from core_service.metrics import CoreMetrics
from core_service.repository import context, context_ai_state
from core_service.repository.context_ai_state import Expiries
from core_service.repository.db import autocommit, transaction
from core_service.service.dispatch import DispatchOutcome, DispatchRequest, WorkerDispatcher
from pinlog_platform import tracing
from pinlog_platform.contract.states import Stage, Status
from pinlog_platform.contract.states.failure_reasons import FailureReason

logger = logging.getLogger(__name__)

# Dispatches of one run in flight at once: bounded, so a batch never floods the worker.
_DISPATCH_CONCURRENCY = 8
# Finalizer batches per run: bounded, so one run cannot spin forever on a huge backlog.
_MAX_FINALIZER_BATCHES = 100
# While paused, the loop looks at the pause state this often (it is cached for 1 s anyway).
PAUSED_POLL_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class RescanReport:
    """Counts of one run (rows, not stages); ``dispatched`` are dispatches a worker took,
    ``dispatch_failed`` the others."""

    blocked_closed: int = 0
    finalized: int = 0
    claimed: int = 0
    dispatched: int = 0
    dispatch_failed: int = 0
    skipped_deleted: int = 0
    skipped_missing: int = 0
    # The claim was skipped: the dispatcher still holds refused work, or the workers asked
    # us to wait (Retry-After).
    waited_for_workers: bool = False
    # Dispatching is paused (pinlog-core pause): nothing was finalized or claimed.
    paused: bool = False

    @property
    def finalized_by_reason(self) -> dict[str, int]:
        """Contexts this run failed, by the reason code written: ``retries_exhausted`` (the
        finalizer) and ``embedding_failed`` (keyword stages that can never run)."""
        return {
            FailureReason.RETRIES_EXHAUSTED.value: self.finalized,
            FailureReason.EMBEDDING_FAILED.value: self.blocked_closed,
        }

    @property
    def anything_happened(self) -> bool:
        return any((self.blocked_closed, self.finalized, self.claimed, self.skipped_missing))


class RescanScheduler:
    """Re-requests stale work and fails exhausted work (§9); tests call ``run_once``."""

    def __init__(
        self,
        engine: AsyncEngine,
        dispatcher: WorkerDispatcher,
        metrics: CoreMetrics,
        *,
        expiries: Expiries,
        max_retry: int,
        batch_size: int,
        period_seconds: float,
    ) -> None:
        self._engine = engine
        self._dispatcher = dispatcher
        self._metrics = metrics
        self._expiries = expiries
        self._max_retry = max_retry
        self._batch_size = batch_size
        self._period_seconds = period_seconds

    @property
    def batch_size(self) -> int:
        return self._batch_size

    async def run_once(self) -> RescanReport:
        """One finalize + rescan pass; nothing while dispatching is paused. Raises
        ``UnavailableError`` if the database is down. Traced as ``rescan pass``: a trace of its
        own in the loop, a child of the command's in ``pinlog-core rescan --once``."""
        with tracing.span("rescan pass") as pass_span:
            report = await self._run_once()
            if pass_span is not None:
                pass_span.set_attributes(
                    {"pinlog.claimed": report.claimed, "pinlog.finalized": report.finalized}
                )
            return report

    async def _run_once(self) -> RescanReport:
        if await self._dispatcher.paused(strict=True):
            return RescanReport(paused=True)
        blocked_closed = await self._finalize_in_batches(self._close_blocked)
        finalized = await self._finalize_in_batches(self._finalize_exhausted)
        if not self._dispatcher.ready:
            return RescanReport(blocked_closed, finalized, waited_for_workers=True)
        async with transaction(self._engine) as conn:
            claimed = await context_ai_state.claim_stale(
                conn,
                expiries=self._expiries,
                max_retry=self._max_retry,
                batch_size=self._batch_size,
            )
        self._metrics.rescan_claims.inc(len(claimed))
        if not claimed:
            return RescanReport(blocked_closed, finalized)
        async with autocommit(self._engine) as conn:
            sources = await context.load_for_dispatch(
                conn, [context_id for context_id, _ in claimed]
            )
        requests, skipped_deleted = [], 0
        for source in sources:
            if source.deleted:
                skipped_deleted += 1
                if not _all_cancelled(source.statuses):
                    logger.warning(
                        "rescan skipped deleted context %d whose state is not CANCELLED (%s)",
                        source.context_id,
                        _describe(source.statuses),
                    )
                continue
            requests.append(
                DispatchRequest(
                    source.context_id,
                    source.member_id,
                    source.record_id,
                    source.body,
                    source.external_place_id,
                    source.place_name,
                )
            )
        known = {source.context_id for source in sources}
        missing = [context_id for context_id, _ in claimed if context_id not in known]
        if missing:
            logger.warning(
                "rescan found %d state row(s) without a core context, not dispatched: %s",
                len(missing),
                missing[:10],
            )
        outcomes = await self._dispatch_all(requests)
        failed = sum(not outcome.result.ran for outcome in outcomes)
        return RescanReport(
            blocked_closed=blocked_closed,
            finalized=finalized,
            claimed=len(claimed),
            dispatched=len(outcomes) - failed,
            dispatch_failed=failed,
            skipped_deleted=skipped_deleted,
            skipped_missing=len(missing),
        )

    async def run_forever(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set: again as soon as the workers take more while there is a
        backlog (a full batch, or a claim skipped while they refused), at once when the
        dispatcher hands rows back, else every ``period_seconds``. A failing run is logged and
        the loop goes on."""
        while not stop.is_set():
            backlog = paused = False
            try:
                report = await self.run_once()
            except UnavailableError:
                logger.warning("rescan skipped: database unavailable")
            except Exception:
                logger.exception("rescan run failed")
            else:
                if report.anything_happened:
                    logger.info("rescan: %s", report)
                backlog = report.waited_for_workers or report.claimed >= self._batch_size
                paused = report.paused
            if paused:
                # Look again soon: on resume the backlog drains at once, not a period later.
                await _first_of(stop, self._dispatcher.rescan_wanted, PAUSED_POLL_SECONDS)
            elif backlog:
                await self._dispatcher.wait_until_ready(self._period_seconds, stop)
            else:
                await _first_of(stop, self._dispatcher.rescan_wanted, self._period_seconds)
            self._dispatcher.rescan_wanted.clear()

    async def _finalize_in_batches(self, one_batch) -> int:
        total = 0
        for _ in range(_MAX_FINALIZER_BATCHES):
            async with transaction(self._engine) as conn:
                closed = await one_batch(conn)
            total += closed
            if closed < self._batch_size:
                break
        return total

    async def _close_blocked(self, conn) -> int:
        closed = await context_ai_state.close_blocked_keyword_stages(
            conn, batch_size=self._batch_size
        )
        if closed:
            self._metrics.finalized.labels("embedding_failed").inc(len(closed))
            logger.info("closed %d keyword stage(s) whose embedding stage failed", len(closed))
        return len(closed)

    async def _finalize_exhausted(self, conn) -> int:
        failed = await context_ai_state.finalize_exhausted(
            conn,
            expiries=self._expiries,
            max_retry=self._max_retry,
            batch_size=self._batch_size,
        )
        if failed:
            self._metrics.finalized.labels("retries_exhausted").inc(len(failed))
            logger.warning(
                "finalizer failed the unfinished stages of %d context(s) with no retries left: %s",
                len(failed),
                failed[:10],
            )
        return len(failed)

    async def _dispatch_all(self, requests: list[DispatchRequest]) -> list[DispatchOutcome]:
        limit = asyncio.Semaphore(_DISPATCH_CONCURRENCY)

        async def one(request: DispatchRequest) -> DispatchOutcome:
            async with limit:
                return await self._dispatcher.dispatch(request, origin="rescan")

        return list(await asyncio.gather(*(one(request) for request in requests)))


async def _first_of(stop: asyncio.Event, wake: asyncio.Event, timeout_seconds: float) -> None:
    """Return when ``stop`` or ``wake`` is set, or after ``timeout_seconds``."""
    waiters = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(wake.wait())}
    try:
        await asyncio.wait(waiters, timeout=timeout_seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


def _all_cancelled(statuses: Mapping[Stage, Status] | None) -> bool:
    """Every stage ``CANCELLED``, as the core's delete leaves a context (§9 Delete)."""
    return statuses is not None and all(status is Status.CANCELLED for status in statuses.values())


def _describe(statuses: Mapping[Stage, Status] | None) -> str:
    """``embedding=PENDING keyword=PENDING`` for a log line; ``no state row`` without one."""
    if statuses is None:
        return "no state row"
    return " ".join(f"{stage.label}={status}" for stage, status in statuses.items())
