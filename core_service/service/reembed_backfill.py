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

**Batches** are cut by the worker's byte limit as well as by count: the proposal is sent in
requests whose body fits the smallest ``maxRequestBytes`` the profile's instances report in
``/readyz`` (``cut_by_bytes``). A 413 (a lower limit than last read) splits the request in
halves; a context that cannot fit in a request alone ends ``FAILED`` ``input_too_long`` (its
own fault: the worker could never take it); the rest proceeds. A request answered with
another error waits the resend delay while the rows behind it go on: a batch a worker cannot
take is never sent first, in the same order, forever.

**By batch** (``reembed start --via batch``, docs/operations.md "Backfill via the Batch
API"): the rows the start marked ``via_batch`` are proposed apart from the pace (the provider's
batch pool is separate from the per-minute budgets), ``BATCH_PROPOSAL`` at a time, and sent
with ``"via": "batch"``: the worker submits them as one provider batch and holds them in it
(``app/service/batch_backfill.py``); a held row is never proposed again, its batch returns it.
The other rows (seeded later: new notes, edits' replacements) go the synchronous way.

**Keyword stages by batch** (``reprocess keywords --via batch``, docs/operations.md
"Reprocess via the Batch API"): the same pass proposes the keyword stages that reprocess
marked (``keyword_batches.propose``, ``BATCH_PROPOSAL`` at a time, not paced, whatever the
switch's state) and sends them to a worker of the profile in use
(``POST /internal/v1/batch/keywords``), which judges them by one provider batch
(``app/service/keyword_batches.py``). Stages no worker took are sendable again at once (after
the backoff); one too large for a request alone goes the synchronous way.

When nothing is open, it **seeds** rows for live contexts still missing a vector (new notes,
edits' replacements), at most every ``SEED_SECONDS``. Killed at any point nothing is lost: a
row sent and never answered is sent again after the resend delay, one a dead worker held is
reclaimed after the processing expiry.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

import orjson
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from core_service.errors import CoreError
from core_service.metrics import CoreMetrics
from core_service.repository import embedding_switch, keyword_batches
from core_service.repository.db import autocommit
from core_service.repository.embedding_switch import BackfillSource, BatchSlot
from core_service.service.pause import PauseSwitch
from core_service.service.process_requests import retry_after
from core_service.service.profile_in_use import CACHE_SECONDS
from core_service.service.switch_status import read_switch_status
from core_service.service.worker_endpoints import WorkerEndpoints, WorkerUnanswered
from pinlog_platform import tracing
from pinlog_platform.contract.states.failure_reasons import FailureReason

logger = logging.getLogger(__name__)

# The states ``reembed status`` reports, each a series of ``pinlog_core_reembed_state``.
SWITCH_STATES = ("idle", "backfilling", "ready", "cut_over", "rolling_back")
# The ``kind`` series of ``pinlog_core_reembed_contexts``, in the order they are set.
SWITCH_CONTEXT_KINDS = ("total", "done", "failed", "missing_in_use")

BACKFILL_PATH = "/internal/v1/backfill/embed"
KEYWORD_BATCH_PATH = "/internal/v1/batch/keywords"
# How the pass sends: embedded now, an embedding batch, a keyword batch (each its own path).
VIA_KEYWORDS = "keywords"
# Contexts per batch at most (the worker takes up to 256); a batch is rate_per_second
# contexts at most, so each slot is about a second.
MAX_BATCH = 64
# Batches of one core process in flight at once: a slow batch must not slow the pace.
MAX_IN_FLIGHT = 2
# How long an idle loop sleeps between looks at the switch (seconds).
IDLE_SECONDS = 5.0
# Seeding scans every live context: not more often than this (seconds).
SEED_SECONDS = 10.0
# State rows given the core's digest and owner per seeding (``vouch_state_rows``).
VOUCH_BATCH = 5_000
# A batch's whole answer: one provider call for up to MAX_BATCH notes and their saves.
BATCH_DEADLINE_SECONDS = 60.0
# How often the switch's gauges are refreshed (seconds): one coverage statement over the live
# contexts; less often while no switch runs.
GAUGE_SECONDS = 15.0
GAUGE_IDLE_SECONDS = 60.0
# Rows marked for the Batch API sent in one request (one provider batch; the worker takes 256).
BATCH_PROPOSAL = 256
# Backoff when no worker took a batch and none said how long to wait (seconds).
REFUSED_BACKOFF_SECONDS = 2.0
# The worker's request body limit when no instance reported one (its default
# PINLOG_MAX_REQUEST_BYTES), and what a request leaves unused below it (bytes).
DEFAULT_WORKER_MAX_REQUEST_BYTES = 65536
BODY_MARGIN_BYTES = 256


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
        self._sent = 0  # proposals sent by this process
        self._gauges_at = -GAUGE_IDLE_SECONDS
        self._gauge_period = GAUGE_SECONDS
        self._seen_profiles: set[str] = set()
        # Contexts of the batches this process sent, by result (the metric's labels).
        self.results: collections.Counter[str] = collections.Counter()

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

    async def run_once(self) -> bool:
        """One pass that sends a batch when there is one (``pinlog-core rescan --once``):
        when the first pass only seeded rows, the next slot (a second at most) is waited for
        and one more pass made. The batches sent are waited for. True when one was sent."""
        for _ in range(2):
            sent_before = self._sent
            wait = await self.pass_once()
            await self.drain()
            if self._sent != sent_before:
                return True
            if wait > 1.0 or await self._pause.paused():
                return False  # idle, backing off or paused: nothing to do this run
            await asyncio.sleep(wait)
        return False

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
            if await self._pass_by_batch():
                return 0.0
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
                        generation=slot.generation,
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
        self._sent += 1
        task = asyncio.create_task(self._send_logged(profile, sources))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)
        return 0.0

    def backoff_seconds(self) -> float:
        """Seconds the workers asked this loop to wait (0 when none)."""
        return max(self._not_before - time.monotonic(), 0.0)

    async def send_by_batch(self) -> bool:
        """Send the next rows marked for the Batch API, if any, and wait for the answer
        (``reembed start --via batch``); whether some were sent (none while dispatching is
        paused)."""
        if await self._pause.paused():
            return False
        sent = await self._pass_by_batch()
        await self.drain()
        return sent

    async def send_keywords_by_batch(self) -> bool:
        """Send the next keyword stages marked for the Batch API, if any, and wait for the
        answer (``reprocess keywords --via batch``); whether some were sent (none while
        dispatching is paused)."""
        if await self._pause.paused():
            return False
        sent = await self._pass_keywords_by_batch()
        await self.drain()
        return sent

    async def _pass_keywords_by_batch(self) -> bool:
        """Propose the next marked keyword stages (not paced) and send them to the workers of
        the profile in use; whether some were proposed."""
        async with autocommit(self._engine) as conn:
            sources = await keyword_batches.propose(
                conn,
                limit=BATCH_PROPOSAL,
                resend_seconds=self._resend_seconds,
                expiry_seconds=self._expiry_seconds,
            )
            if not sources:
                return False
            row = await embedding_switch.read(conn)
        profile = self._configured if row is None else row.profile_in_use
        self._sent += 1
        task = asyncio.create_task(self._send_logged(profile, sources, via=VIA_KEYWORDS))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)
        return True

    async def _pass_by_batch(self) -> bool:
        """Propose the next rows marked for the Batch API (not paced) and send them with
        ``"via": "batch"``, else the next marked keyword stages; whether some were
        proposed."""
        if await self._pass_embeddings_by_batch():
            return True
        return await self._pass_keywords_by_batch()

    async def _pass_embeddings_by_batch(self) -> bool:
        async with autocommit(self._engine) as conn:
            row = await embedding_switch.read(conn)
            if row is None or row.via != "batch" or row.state == "idle":
                return False
            assert row.other_profile is not None  # not idle (0061's CHECK)
            if row.state == "rolling_back":
                profiles: tuple[str, ...] = (row.profile_in_use,)
            else:
                profiles = (row.other_profile, row.profile_in_use)
            for profile in profiles:
                sources = await embedding_switch.propose(
                    conn,
                    profile=profile,
                    limit=BATCH_PROPOSAL,
                    resend_seconds=self._resend_seconds,
                    expiry_seconds=self._expiry_seconds,
                    generation=row.generation,
                    via_batch=True,
                )
                if sources:
                    break
            else:
                return False
        self._sent += 1
        task = asyncio.create_task(self._send_logged(profile, sources, via="batch"))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)
        return True

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
        # Notes older than the core's digest (``vouch_state_rows``): claimable once vouched.
        await embedding_switch.vouch_state_rows(conn, batch=VOUCH_BATCH)
        added = 0
        if slot.state != "rolling_back":
            added += await embedding_switch.seed(
                conn, profile=slot.other_profile, completed_only=False, generation=slot.generation
            )
        added += await embedding_switch.seed(
            conn, profile=slot.profile_in_use, completed_only=True, generation=slot.generation
        )
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

    async def _send_logged(
        self, profile: str, sources: list[BackfillSource], via: str = "sync"
    ) -> None:
        # A trace of its own in the loop (its task has no span); a child of the command's in
        # `pinlog-core rescan --once`.
        try:
            with tracing.span("backfill batch", contexts=len(sources)):
                await self._send(profile, sources, via)
        except asyncio.CancelledError:
            raise
        except Exception:
            # Its rows are sent again after the resend delay.
            logger.exception("backfill batch failed; continuing")

    async def _send(self, profile: str, sources: list[BackfillSource], via: str) -> None:
        """One proposal to instances of ``profile``, in requests cut to the smallest body
        limit they report (``maxRequestBytes``; module docstring "Batches"), sent ``via``
        ``sync`` or ``batch``."""
        limit = self._byte_limit(profile)
        requests, unsendable = cut_by_bytes(profile, sources, limit)
        queue = collections.deque(requests)
        while queue:
            batch = queue.popleft()
            outcome = await self._post(profile, batch, via)
            if outcome == "too_large":
                if len(batch) == 1:
                    unsendable.extend(batch)
                else:  # the worker's limit is lower than last read: halves, in order
                    half = len(batch) // 2
                    queue.extendleft((batch[half:], batch[:half]))
            elif outcome == "refused":
                # Not now: this and the rest go back at once, after the backoff.
                rest = [s for part in (batch, *queue) for s in part]
                if via != "sync" and self._no_instance_takes_batches(profile, via):
                    # Never by batch any more (reconfigured): the synchronous way, not a
                    # resend every backoff for ever.
                    await self._to_sync(profile, rest, via)
                elif via == VIA_KEYWORDS:
                    await self._unmark_keywords(rest)
                else:
                    await self._unmark(profile, rest)
                break
        if unsendable and via == VIA_KEYWORDS:
            await self._keywords_to_sync(unsendable)
        elif unsendable:
            await self._fail_unsendable(profile, unsendable, limit)

    def _byte_limit(self, profile: str) -> int:
        """The smallest body limit the instances of ``profile`` reported (bytes), else the
        worker's default."""
        known = [
            e.max_request_bytes
            for e in self._endpoints.in_turn(profile)
            if e.max_request_bytes is not None
        ]
        return min(known, default=DEFAULT_WORKER_MAX_REQUEST_BYTES)

    async def _post(self, profile: str, batch: list[BackfillSource], via: str) -> str:
        """Send one request: ``done`` (answered, or sent and unanswered: its claims settle or
        are reclaimed), ``too_large`` (413), ``refused`` (no instance took it; the backoff is
        set) or ``skipped`` (an error answer: the rows wait the resend delay while the rows
        behind them go on, so a batch a worker cannot take is never retried first forever)."""
        payload = backfill_payload(profile, batch)
        if via == "batch":
            payload["via"] = "batch"
        path = KEYWORD_BATCH_PATH if via == VIA_KEYWORDS else BACKFILL_PATH
        waits: list[float] = []
        for endpoint in self._endpoints.in_turn(profile):
            try:
                answer = await endpoint.post_json(
                    path, payload, deadline_seconds=BATCH_DEADLINE_SECONDS,
                    read_timeout_seconds=BATCH_DEADLINE_SECONDS,
                )  # fmt: skip
            except WorkerUnanswered as failed:
                if failed.whole_request_sent:
                    # The worker may be working on it: its claims settle or are reclaimed.
                    logger.warning("backfill batch unanswered (%s)", failed.cause)
                    return "done"
                continue
            if answer.status == 200:
                if via != VIA_KEYWORDS:  # the backfill's metric counts contexts embedded
                    self._count(orjson.loads(answer.body))
                return "done"
            if answer.status == 413:
                logger.warning(
                    "backfill request of %d context(s) over the worker's body limit (413)",
                    len(batch),
                )
                return "too_large"
            if answer.status in (409, 503):
                wait = retry_after(answer.headers)
                if wait is not None:
                    waits.append(wait)
                continue
            logger.error("backfill batch: worker answered HTTP %d", answer.status)
            self._tally("refused", len(batch))
            return "skipped"
        self._not_before = time.monotonic() + (min(waits) if waits else REFUSED_BACKOFF_SECONDS)
        self._tally("refused", len(batch))
        return "refused"

    def _no_instance_takes_batches(self, profile: str, via: str) -> bool:
        """Every instance known to serve ``profile`` said in its last ``/readyz`` that it
        takes no batches of this kind (its judge's for keyword stages), and one at least."""
        said = [
            e.judge_takes_batches if via == VIA_KEYWORDS else e.takes_batches
            for e in self._endpoints.in_turn(profile)
            if e.profile == profile
        ]
        return bool(said) and all(takes is False for takes in said)

    async def _to_sync(self, profile: str, sources: list[BackfillSource], via: str) -> None:
        ids = [s.context_id for s in sources]
        logger.warning(
            "%d %s marked for the Batch API go the synchronous way: no worker of %s takes batches",
            len(ids),
            "keyword stage(s)" if via == VIA_KEYWORDS else "backfill row(s)",
            profile,
        )
        if via == VIA_KEYWORDS:
            await self._keywords_to_sync(sources)
        else:
            await self._or_left(
                "backfill rows",
                lambda conn: embedding_switch.return_to_sync(
                    conn, profile=profile, context_ids=ids
                ),
            )

    async def _unmark(self, profile: str, sources: list[BackfillSource]) -> None:
        ids = [s.context_id for s in sources]
        await self._or_left(
            "backfill rows",
            lambda conn: embedding_switch.unmark(conn, profile=profile, context_ids=ids),
        )

    async def _unmark_keywords(self, sources: list[BackfillSource]) -> None:
        ids = [s.context_id for s in sources]
        await self._or_left("keyword stages", lambda conn: keyword_batches.unmark(conn, ids))

    async def _keywords_to_sync(self, sources: list[BackfillSource]) -> None:
        """Too large for a request alone: judged the synchronous way (the rescan sends it)."""
        ids = [s.context_id for s in sources]
        await self._or_left(
            "keyword stages", lambda conn: keyword_batches.return_to_sync(conn, ids)
        )

    async def _or_left(
        self, what: str, step: Callable[[AsyncConnection], Awaitable[object]]
    ) -> None:
        """Run ``step`` in a transaction of its own; a database fault leaves ``what`` for the
        resend delay (logged, not raised)."""
        try:
            async with autocommit(self._engine) as conn:
                await step(conn)
        except CoreError as exc:
            logger.warning("%s left for the resend delay (%s)", what, type(exc).__name__)

    async def _fail_unsendable(
        self, profile: str, sources: list[BackfillSource], limit: int
    ) -> None:
        try:
            async with autocommit(self._engine) as conn:
                await embedding_switch.fail_unsendable(
                    conn,
                    profile=profile,
                    context_ids=[s.context_id for s in sources],
                    reason=FailureReason.INPUT_TOO_LONG.value,
                )
        except CoreError as exc:
            logger.warning("backfill rows left for the resend delay (%s)", type(exc).__name__)
            return
        self._tally("failed", len(sources))
        for source in sources:
            logger.info(
                "backfill failed: context_id=%d reason=input_too_long (over the worker's "
                "%d-byte request limit alone)",
                source.context_id,
                limit,
            )

    async def _refresh_gauges(self) -> None:
        """The switch's state, coverage and vectors per profile, every ``GAUGE_SECONDS``."""
        if time.monotonic() - self._gauges_at < self._gauge_period:
            return
        self._gauges_at = time.monotonic()
        try:
            report = await read_switch_status(self._engine, configured=self._configured)
        except CoreError as exc:
            logger.warning("switch gauges not refreshed (%s)", type(exc).__name__)
            return
        for state in SWITCH_STATES:
            self._metrics.reembed_state.labels(state).set(1 if report.state == state else 0)
        counts = (report.total, report.done, report.failed_total, report.missing_in_use)
        for kind, value in zip(SWITCH_CONTEXT_KINDS, counts, strict=True):
            self._metrics.reembed_contexts.labels(kind).set(value)
        for profile in self._seen_profiles - set(report.vectors):
            self._metrics.embedding_vectors.labels(profile).set(0)
        for profile, counts in report.vectors.items():
            self._metrics.embedding_vectors.labels(profile).set(counts["live"])
        self._seen_profiles |= set(report.vectors)
        self._gauge_period = GAUGE_IDLE_SECONDS if report.state == "idle" else GAUGE_SECONDS

    def _tally(self, result: str, count: int) -> None:
        self.results[result] += count
        self._metrics.backfill_contexts.labels(result).inc(count)

    def _count(self, answer: object) -> None:
        if not isinstance(answer, dict):
            return
        for key, label in (("completed", "completed"), ("cancelled", "cancelled"),
                           ("failed", "failed"), ("notClaimed", "not_claimed"),
                           ("lost", "lost"), ("putBack", "put_back"),
                           ("batched", "batched")):  # fmt: skip
            value = answer.get(key)
            if isinstance(value, int) and value > 0:
                self._tally(label, value)


def backfill_item(source: BackfillSource) -> dict[str, object]:
    """One context of a backfill request, as the worker reads it."""
    return {
        "contextId": source.context_id,
        "userId": source.member_id,
        "recordId": source.record_id,
        "text": source.body,
    }


def backfill_payload(profile: str, sources: list[BackfillSource]) -> dict[str, object]:
    """The body of ``POST /internal/v1/backfill/embed``."""
    return {"embeddingProfile": profile, "contexts": [backfill_item(s) for s in sources]}


def cut_by_bytes(
    profile: str, sources: list[BackfillSource], limit: int
) -> tuple[list[list[BackfillSource]], list[BackfillSource]]:
    """``sources`` in order, cut into requests whose JSON body is at most ``limit`` bytes
    (``limit`` minus ``BODY_MARGIN_BYTES``, for the encoder's slack), and the sources that
    do not fit in one alone."""
    room = limit - BODY_MARGIN_BYTES
    envelope = len(orjson.dumps(backfill_payload(profile, [])))
    requests: list[list[BackfillSource]] = []
    unsendable: list[BackfillSource] = []
    current: list[BackfillSource] = []
    size = envelope
    for source in sources:
        item = len(orjson.dumps(backfill_item(source))) + 1  # and its comma
        if envelope + item > room:
            unsendable.append(source)
            continue
        if current and size + item > room:
            requests.append(current)
            current, size = [], envelope
        current.append(source)
        size += item
    if current:
        requests.append(current)
    return requests, unsendable
