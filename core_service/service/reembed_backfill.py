"""The core's half of the re-embedding backfill: a loop in every core process
(docs/operations.md "Switching the embedding profile").

While a switch is under way (``core.embedding_switch.state`` backfilling or cut_over), the
loop keeps two profiles complete: the **other profile** (the target while backfilling, the
previous one after the cutover, so a rollback loses nothing) gets a vector for every live
context, and the **profile in use** for every live context whose embedding stage completed
without one (embedded under the other profile just before a cutover). In **rolling_back**
(a rollback after the cutover) only the restored profile in use is filled: the notes a
process embedded under the abandoned profile while its cached profile caught up; once none
is left (and the cache window has passed) the loop itself moves the switch to idle in one
guarded statement (``embedding_switch.move_to_idle``). Each pass:

1. waits while dispatching is paused (``pinlog-core pause``) or the workers asked to wait
   (``Retry-After`` of a 503: H3's backpressure);
2. takes the next **batch slot** of the shared pace (``embedding_switch.take_batch_slot``):
   every core process together sends at most ``rate_per_second`` contexts a second;
3. **proposes** the next open rows of a profile in id order (``propose``; marked sent, so
   two processes never send the same row at once), and sends them to a worker of that
   profile (``POST /internal/v1/backfill/embed``), which claims, embeds and saves them
   (``app/service/profile_backfill.py``). Rows no worker took are made sendable again.

When nothing is open, it **seeds** rows for live contexts still missing a vector (new notes,
edits' replacements), at most every ``SEED_SECONDS``. Killed at any point nothing is lost: a
row sent and never answered is sent again after the resend delay, one a dead worker held is
reclaimed after the processing expiry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import orjson
from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.errors import CoreError
from core_service.metrics import CoreMetrics
from core_service.repository import embedding_switch
from core_service.repository.db import autocommit
from core_service.repository.embedding_switch import BackfillSource, BatchSlot
from core_service.service import reembed
from core_service.service.pause import PauseSwitch
from core_service.service.process_requests import retry_after
from core_service.service.profile_in_use import CACHE_SECONDS
from core_service.service.worker_endpoints import WorkerEndpoints, WorkerUnanswered

logger = logging.getLogger(__name__)

BACKFILL_PATH = "/internal/v1/backfill/embed"
# Contexts per batch at most (the worker takes up to 256); a batch is rate_per_second
# contexts at most, so each slot is about a second.
MAX_BATCH = 64
# Batches of one core process in flight at once: a slow batch must not slow the pace.
MAX_IN_FLIGHT = 2
# How long an idle loop sleeps between looks at the switch (seconds).
IDLE_SECONDS = 5.0
# Seeding scans every live context: not more often than this (seconds).
SEED_SECONDS = 10.0
# A batch's whole answer: one provider call for up to MAX_BATCH notes and their saves.
BATCH_DEADLINE_SECONDS = 60.0
# How often the switch's gauges are refreshed (seconds): one coverage statement over the live
# contexts; less often while no switch runs.
GAUGE_SECONDS = 15.0
GAUGE_IDLE_SECONDS = 60.0
# Backoff when no worker took a batch and none said how long to wait (seconds).
REFUSED_BACKOFF_SECONDS = 2.0


class ReembedBackfill:
    """The backfill loop of one core process (module docstring)."""

    def __init__(
        self,
        engine: AsyncEngine,
        endpoints: WorkerEndpoints,
        pause: PauseSwitch,
        metrics: CoreMetrics,
        *,
        configured_profile: str,
        resend_seconds: float,
        expiry_seconds: float,
        max_batch: int = MAX_BATCH,
    ) -> None:
        self._engine = engine
        self._endpoints = endpoints
        self._pause = pause
        self._metrics = metrics
        self._configured = configured_profile
        self._resend_seconds = resend_seconds
        self._expiry_seconds = expiry_seconds
        self._max_batch = max_batch
        self._seeded_at = -SEED_SECONDS
        self._not_before = 0.0  # monotonic: the workers asked to wait until then
        self._in_flight: set[asyncio.Task[None]] = set()
        self._gauges_at = -GAUGE_IDLE_SECONDS
        self._gauge_period = GAUGE_SECONDS
        self._seen_profiles: set[str] = set()

    async def run_forever(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                try:
                    await self._refresh_gauges()
                    wait = await self.pass_once()
                except Exception:
                    logger.exception("backfill pass failed; continuing")
                    wait = IDLE_SECONDS
                if wait > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), wait)
        finally:
            for task in self._in_flight:
                task.cancel()  # its rows are sent again after the resend delay

    async def drain(self) -> None:
        """Wait for the batches in flight (tests and commands)."""
        while self._in_flight:
            await asyncio.gather(*self._in_flight, return_exceptions=True)

    async def pass_once(self) -> float:
        """One pass (module docstring); the seconds to wait before the next."""
        backoff = self._not_before - time.monotonic()
        if backoff > 0:
            return backoff
        if await self._pause.paused():
            return 1.0
        if len(self._in_flight) >= MAX_IN_FLIGHT:
            await asyncio.wait(set(self._in_flight), return_when=asyncio.FIRST_COMPLETED)
        try:
            async with autocommit(self._engine) as conn:
                slot = await embedding_switch.take_batch_slot(conn, max_batch=self._max_batch)
                if slot is None:
                    seconds = await embedding_switch.seconds_until_slot(conn)
                    return IDLE_SECONDS if seconds is None else min(max(seconds, 0.02), 1.0)
                for profile in self._profiles(slot):
                    sources = await embedding_switch.propose(
                        conn,
                        profile=profile,
                        limit=slot.batch,
                        resend_seconds=self._resend_seconds,
                        expiry_seconds=self._expiry_seconds,
                    )
                    if sources:
                        break
                else:
                    await self._seed(conn, slot)
                    if slot.state == "rolling_back":
                        await self._end_rollback(conn, slot)
                    return 0.5
        except CoreError as exc:
            logger.warning("backfill pass skipped (%s)", type(exc).__name__)
            return IDLE_SECONDS
        task = asyncio.create_task(self._send_logged(profile, sources))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)
        return 0.0

    @staticmethod
    def _profiles(slot: BatchSlot) -> tuple[str, ...]:
        """The profiles whose rows a slot may send: in rolling_back the restored profile in
        use only (nothing more is spent on the abandoned one)."""
        if slot.state == "rolling_back":
            return (slot.profile_in_use,)
        return (slot.other_profile, slot.profile_in_use)

    async def _seed(self, conn, slot: BatchSlot) -> None:
        if time.monotonic() - self._seeded_at < SEED_SECONDS:
            return
        self._seeded_at = time.monotonic()
        added = 0
        if slot.state != "rolling_back":
            added += await embedding_switch.seed(
                conn, profile=slot.other_profile, completed_only=False
            )
        added += await embedding_switch.seed(conn, profile=slot.profile_in_use, completed_only=True)
        if added:
            logger.info("backfill: %d context(s) newly missing a vector", added)

    async def _end_rollback(self, conn, slot: BatchSlot) -> None:
        """Nothing open: the rollback is done once no live completed note lacks a vector of
        the restored profile (``MOVE_TO_IDLE``, guarded by the slot's generation, after the
        profile cache window; a note seeded meanwhile keeps it rolling back)."""
        moved = await embedding_switch.move_to_idle(
            conn,
            generation=slot.generation,
            in_use=slot.profile_in_use,
            window_seconds=CACHE_SECONDS,
        )
        if moved is not None:
            logger.warning(
                "embedding profile rollback to %s done: switch idle", moved.profile_in_use
            )

    async def _send_logged(self, profile: str, sources: list[BackfillSource]) -> None:
        try:
            await self._send(profile, sources)
        except asyncio.CancelledError:
            raise
        except Exception:
            # Its rows are sent again after the resend delay.
            logger.exception("backfill batch failed; continuing")

    async def _send(self, profile: str, sources: list[BackfillSource]) -> None:
        """One batch to an instance of ``profile``; rows none took are unmarked."""
        payload = {
            "embeddingProfile": profile,
            "contexts": [
                {"contextId": s.context_id, "userId": s.member_id, "recordId": s.record_id,
                 "text": s.body}
                for s in sources
            ],
        }  # fmt: skip
        waits: list[float] = []
        for endpoint in self._endpoints.in_turn(profile):
            try:
                answer = await endpoint.post_json(
                    BACKFILL_PATH, payload, deadline_seconds=BATCH_DEADLINE_SECONDS,
                    read_timeout_seconds=BATCH_DEADLINE_SECONDS,
                )  # fmt: skip
            except WorkerUnanswered as failed:
                if failed.whole_request_sent:
                    # The worker may be working on it: its claims settle or are reclaimed.
                    logger.warning("backfill batch unanswered (%s)", failed.cause)
                    return
                continue
            if answer.status == 200:
                self._count(orjson.loads(answer.body))
                return
            if answer.status in (409, 503):
                wait = retry_after(answer.headers)
                if wait is not None:
                    waits.append(wait)
                continue
            logger.error("backfill batch: worker answered HTTP %d", answer.status)
            break
        self._not_before = time.monotonic() + (min(waits) if waits else REFUSED_BACKOFF_SECONDS)
        self._metrics.backfill_contexts.labels("refused").inc(len(sources))
        try:
            async with autocommit(self._engine) as conn:
                await embedding_switch.unmark(
                    conn, profile=profile, context_ids=[s.context_id for s in sources]
                )
        except CoreError as exc:
            logger.warning("backfill rows left for the resend delay (%s)", type(exc).__name__)

    async def _refresh_gauges(self) -> None:
        """The switch's state, coverage and vectors per profile, every ``GAUGE_SECONDS``."""
        if time.monotonic() - self._gauges_at < self._gauge_period:
            return
        self._gauges_at = time.monotonic()
        try:
            report = await reembed.status(self._engine, configured=self._configured)
        except CoreError as exc:
            logger.warning("switch gauges not refreshed (%s)", type(exc).__name__)
            return
        for state in ("idle", "backfilling", "ready", "cut_over", "rolling_back"):
            self._metrics.reembed_state.labels(state).set(1 if report.state == state else 0)
        for kind, value in (("total", report.total), ("done", report.done),
                            ("failed", report.failed_total),
                            ("missing_in_use", report.missing_in_use)):  # fmt: skip
            self._metrics.reembed_contexts.labels(kind).set(value)
        for profile in self._seen_profiles - set(report.vectors):
            self._metrics.embedding_vectors.labels(profile).set(0)
        for profile, counts in report.vectors.items():
            self._metrics.embedding_vectors.labels(profile).set(counts["live"])
        self._seen_profiles |= set(report.vectors)
        self._gauge_period = GAUGE_IDLE_SECONDS if report.state == "idle" else GAUGE_SECONDS

    def _count(self, answer: object) -> None:
        if not isinstance(answer, dict):
            return
        for key, label in (("completed", "completed"), ("cancelled", "cancelled"),
                           ("failed", "failed"), ("notClaimed", "not_claimed"),
                           ("lost", "lost")):  # fmt: skip
            value = answer.get(key)
            if isinstance(value, int) and value > 0:
                self._metrics.backfill_contexts.labels(label).inc(value)
