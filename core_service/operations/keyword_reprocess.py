"""A preset reclassification: ``pinlog-core reprocess keywords`` (docs/operations.md).

After ``pinlog-ai presets load`` wrote a new preset list, every live context judged with an
older list is judged again, through the normal entry point (the worker's process request), as
the explicit batch path the seed allows (seed 000 §2 and §2.1, the §0 operational ``COMPLETED ->
PENDING`` reset):

1. **The list version** of the profile in use is read from the database
   (``pinlog_platform.contract.preset_list``); none usable is an error.
2. **The workers**: every instance listed in ``PINLOG_CORE_WORKER_BASE_URL`` that serves the
   profile (or cannot be read) must report that version in its ``/readyz`` body before anything
   is reset, so no context is re-judged with the old list; workers of another profile (a switch
   under way) are not asked. The version is read again on every look, so a load that lands
   meanwhile is waited for instead.
3. **The reset**, in batches of ``rate`` contexts, at most one batch a second: each batch is one
   transaction (``repository.keyword_reprocess``: the next stale judgments after the run's
   cursor, then their keyword stages back to ``PENDING``, guarded), then each reset context is
   dispatched through the ``WorkerDispatcher`` (origin ``reprocess``); refused dispatches wait
   in its retry set, or for the rescan. The cursor only moves forward and the guard requires
   an older judgment, so a context is reset at most once per run. Nothing is reset while
   dispatching is paused, and a batch waits while the workers refuse.

Killed at any point, nothing is lost: reset contexts are ``PENDING`` and the rescan dispatches
them; a second run resets only what is still judged with an older list. Reads keep showing a
context's previous keywords until its new judgment is saved
(``pinlog_platform.contract.keyword_reads``).

**Via batch** (``--via batch``; docs/operations.md "Reprocess via the Batch API"): refused
(nothing reset) while a worker of the profile reports ``keywordBatch`` false or dispatching is
paused. The reset marks each stage for the provider's Batch API
(``keyword_via_batch``, recorded on the state row so every core process sends it the same
way), ``BATCH_RESET`` at a time and not paced (the provider's batch pool is separate from the
per-minute budgets), and dispatches nothing: the backfill loop of every core process sends
the marked stages to the workers (``ReembedBackfill.send_keywords_by_batch``), which submit
them as provider batches; this command sends the first ones itself, waits until the first
batch is submitted, prints its id and exits (``--wait-results``: until every marked stage is
settled). Stages reset later (new notes, edits' replacements, another run without
``--via batch``) go the synchronous way.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import typer
from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.command_startup import fail, load, run_operation
from core_service.composition import Operations
from core_service.operations.batch_waits import (
    SUBMIT_WAIT_SECONDS,
    BatchesStillOpen,
    Via,
    send_marked,
    wait_until_settled,
)
from core_service.repository import (
    context,
    context_ai_state,
    embedding_switch,
    keyword_batches,
    keyword_reprocess,
    provider_batches,
)
from core_service.repository.db import autocommit, transaction
from core_service.service.dispatch import DispatchOutcome, DispatchRequest, WorkerDispatcher
from core_service.service.pause import PauseSwitch
from core_service.service.worker_readiness import (
    ReadinessReader,
    WorkerReadiness,
    display_url,
)
from pinlog_platform.cli import exit_codes, numbers

logger = logging.getLogger(__name__)

ORIGIN = "reprocess"
# Dispatches of one batch in flight at once, as the rescan's.
DISPATCH_CONCURRENCY = 8
# How often the workers' /readyz and the pause state are looked at while waiting (seconds).
POLL_SECONDS = 1.0
# Longest wait for refusing workers before a batch and at the end (seconds).
READY_WAIT_SECONDS = 60.0
# Via batch: stages reset (and marked) per transaction, not paced.
BATCH_RESET = 1_000


class BatchRefused(Exception):
    """``--via batch`` refused before anything was reset; ``details`` name the workers."""

    def __init__(self, message: str, details: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.details = tuple(details)


class NoUsablePresets(Exception):
    """No preset is usable under the profile in use: nothing to judge with."""


class WorkersNotReady(Exception):
    """Not every listed worker reported the current list version in time; ``readings`` are
    the last answers, ``version`` the list version waited for."""

    def __init__(self, version: int, readings: Sequence[WorkerReadiness]) -> None:
        super().__init__(f"workers did not report preset list version {version}")
        self.version = version
        self.readings = tuple(readings)


class ProfileInUseChanged(Exception):
    """A cutover or rollback changed the profile in use during the run: the run stops before
    resetting anything under the old one; ``report`` is what it did until then."""

    def __init__(self, profile: str, in_use: str, report: ReprocessReport) -> None:
        super().__init__(f"the profile in use changed from {profile} to {in_use}")
        self.profile = profile
        self.in_use = in_use
        self.report = report


@dataclass(frozen=True, slots=True)
class ReprocessPlan:
    """``stale`` live contexts of ``profile`` judged with a list older than ``version``."""

    profile: str
    version: int
    stale: int


@dataclass(slots=True)
class ReprocessReport:
    """A run so far: ``reset`` contexts sent back and dispatched, of ``total`` planned;
    ``taken`` dispatches a worker took at once, ``waiting`` the others (held or left to the
    rescan); ``skipped`` selected but changed meanwhile (deleted, edited, failed);
    ``reset_ids`` in the order reset; ``batch_id``: with ``--via batch``, the first provider
    batch the workers submitted (nothing is dispatched then: ``taken`` stays 0)."""

    version: int
    total: int
    reset: int = 0
    taken: int = 0
    waiting: int = 0
    skipped: int = 0
    batches: int = 0
    seconds: float = 0.0
    reset_ids: list[int] = field(default_factory=list)
    batch_id: str | None = None


def workers_on(readings: Sequence[WorkerReadiness], *, profile: str, version: int) -> bool:
    """Every worker serving ``profile`` (at least one; workers of another profile run beside
    them during a switch and are not asked) is ready with list ``version`` loaded; one that
    cannot be read may serve it and must answer."""
    serving = [r for r in readings if r.profile in (profile, None)]
    return any(r.profile == profile for r in serving) and all(
        r.ready and r.profile == profile and r.preset_version == version for r in serving
    )


class KeywordReprocess:
    """One reclassification run for ``profile`` (module docstring)."""

    def __init__(self, engine: AsyncEngine, *, profile: str) -> None:
        self._engine = engine
        self._profile = profile

    async def plan(self, version: int | None = None) -> ReprocessPlan:
        """The current list version (or ``version``) and how many judgments are older.
        Raises ``NoUsablePresets`` when the profile has no usable preset."""
        if version is None:
            version = await self._version()
        async with autocommit(self._engine) as conn:
            stale = await keyword_reprocess.count_stale(
                conn, profile=self._profile, version=version
            )
        return ReprocessPlan(self._profile, version, stale)

    async def wait_for_workers(
        self,
        reader: ReadinessReader,
        *,
        timeout_seconds: float,
        on_wait: Callable[[int, Sequence[WorkerReadiness]], None] | None = None,
        poll_seconds: float = POLL_SECONDS,
    ) -> int:
        """The current list version, once every worker of ``reader`` reports it; raises
        ``WorkersNotReady`` after ``timeout_seconds`` and ``NoUsablePresets`` when there is no
        list. ``on_wait(version, readings)`` is called after each look that was not enough."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_seconds
        while True:
            version = await self._version()
            readings = await reader.read_all()
            if workers_on(readings, profile=self._profile, version=version):
                return version
            if loop.time() >= deadline:
                raise WorkersNotReady(version, readings)
            if on_wait is not None:
                on_wait(version, readings)
            await asyncio.sleep(min(poll_seconds, max(deadline - loop.time(), 0)))

    async def _version(self) -> int:
        """The list version of the profile now; ``NoUsablePresets`` for none."""
        async with autocommit(self._engine) as conn:
            version = await keyword_reprocess.list_version(conn, self._profile)
        if version == 0:
            raise NoUsablePresets(self._profile)
        return version

    async def run(
        self,
        plan: ReprocessPlan,
        dispatcher: WorkerDispatcher,
        *,
        rate: int,
        on_progress: Callable[[ReprocessReport], None] | None = None,
        on_paused: Callable[[], None] | None = None,
        via_batch: bool = False,
    ) -> ReprocessReport:
        """Reset and dispatch every stale judgment of ``plan``, ``rate`` contexts a second
        at most (module docstring); the report of the whole run. The dispatcher's retry loop
        must run (``start``). ``via_batch``: reset ``BATCH_RESET`` at a time, unpaced, marked
        for the Batch API, and dispatch nothing (the backfill loops send them)."""
        if via_batch:
            rate = max(rate, BATCH_RESET)
        loop = asyncio.get_running_loop()
        report = ReprocessReport(plan.version, plan.stale)
        started = next_batch_at = loop.time()
        after = 0
        stop = asyncio.Event()  # never set: the command ends by finishing or being killed
        while True:
            await asyncio.sleep(max(next_batch_at - loop.time(), 0))
            await self._wait_while_paused(dispatcher, on_paused)
            if not dispatcher.ready:
                await dispatcher.wait_until_ready(READY_WAIT_SECONDS, stop)
            async with transaction(self._engine) as conn:
                # The switch row share-locked: a cutover or rollback waits for this batch, and
                # a batch after one stops the run instead of resetting under the old profile.
                in_use = await embedding_switch.lock_profile_in_use(conn)
                if in_use is not None and in_use != self._profile:
                    raise ProfileInUseChanged(self._profile, in_use, report)
                selected = await keyword_reprocess.select_stale(
                    conn, profile=self._profile, version=plan.version, after=after, limit=rate
                )
                reset = await keyword_reprocess.reset_keyword_stages(
                    conn, selected, profile=self._profile, version=plan.version,
                    via_batch=via_batch,
                )  # fmt: skip
            if not selected:
                break
            after = selected[-1]
            next_batch_at = loop.time() if via_batch else max(next_batch_at + 1.0, loop.time())
            outcomes = [] if via_batch else await self._dispatch(dispatcher, reset)
            report.batches += 1
            report.reset += len(reset)
            report.reset_ids.extend(reset)
            report.skipped += len(selected) - len(reset)
            report.taken += sum(outcome.result.ran for outcome in outcomes)
            report.waiting = report.reset - report.taken
            report.seconds = loop.time() - started
            if on_progress is not None:
                on_progress(report)
        if report.reset and not via_batch and not await dispatcher.paused():
            await dispatcher.wait_until_ready(READY_WAIT_SECONDS, stop)
            async with autocommit(self._engine) as conn:
                report.taken = await context_ai_state.count_taken(conn, report.reset_ids)
            report.waiting = report.reset - report.taken
        report.seconds = loop.time() - started
        logger.info(
            "keyword reprocess to list version %d: reset %d, taken %d, skipped %d",
            plan.version,
            report.reset,
            report.taken,
            report.skipped,
        )
        return report

    async def _wait_while_paused(
        self, dispatcher: WorkerDispatcher, on_paused: Callable[[], None] | None
    ) -> None:
        told = False
        while await dispatcher.paused():
            if not told and on_paused is not None:
                on_paused()
            told = True
            await asyncio.sleep(POLL_SECONDS)

    async def _dispatch(
        self, dispatcher: WorkerDispatcher, context_ids: Sequence[int]
    ) -> list[DispatchOutcome]:
        """Dispatch the reset contexts as the rescan does (the stored body, its place); a
        context deleted meanwhile is not sent (its state is ``CANCELLED``)."""
        if not context_ids:
            return []
        async with autocommit(self._engine) as conn:
            sources = await context.load_for_dispatch(conn, list(context_ids))
        requests = [
            DispatchRequest(s.context_id, s.member_id, s.record_id, s.body,
                            s.external_place_id, s.place_name)
            for s in sources
            if not s.deleted
        ]  # fmt: skip
        limit = asyncio.Semaphore(DISPATCH_CONCURRENCY)

        async def one(request: DispatchRequest) -> DispatchOutcome:
            async with limit:
                return await dispatcher.dispatch(request, origin=ORIGIN)

        return list(await asyncio.gather(*(one(request) for request in requests)))


def refuse_batch_unless_taken(readings: Sequence[WorkerReadiness], *, profile: str) -> None:
    """``BatchRefused`` naming the workers of ``profile`` that report no Batch API for the
    judge (``keywordBatch`` false: vLLM, Ollama, votes above 1, or PINLOG_JUDGE_BATCH_API
    false)."""
    refusing = [r for r in readings if r.profile == profile and not r.keyword_batch]
    if refusing:
        raise BatchRefused(
            f"--via batch: these workers of profile {profile} report no Batch API for their "
            "judge (`keywordBatch` false in /readyz; vLLM and Ollama have none, votes above 1 "
            "ask more than once, or PINLOG_JUDGE_BATCH_API is false); nothing was reset: run "
            "with --via sync",
            [display_url(r.base_url) for r in refusing],
        )


@dataclass(frozen=True, slots=True)
class KeywordBatchesSubmitted:
    """What ``submit_by_batch`` saw: the first keyword batch submitted since the start
    (``None``: none within the wait), the keyword batches of the profile by state, and the
    marked stages still open."""

    first_batch_id: str | None
    batches: provider_batches.BatchCounts
    open_stages: int


async def submit_by_batch(
    operations: Operations, *, profile: str, since: datetime, wait_seconds: float
) -> KeywordBatchesSubmitted:
    """Send the stages the reset marked to the workers of ``profile`` (each request one
    provider batch they submit; ``ReembedBackfill.send_keywords_by_batch``) until none is left
    to send or ``wait_seconds`` passed; the first batch submitted since ``since``. The core
    processes' backfill loops send what is left."""
    await send_marked(
        operations, lambda loop: loop.send_keywords_by_batch(), wait_seconds=wait_seconds
    )
    async with autocommit(operations.engine) as conn:
        first = await provider_batches.first_since(
            conn, profile=profile, since=since, kind="keyword"
        )
        counts_now = await provider_batches.counts(conn, profile=profile, kind="keyword")
        open_stages = await keyword_batches.open_via_batch(conn)
    return KeywordBatchesSubmitted(first, counts_now, open_stages)


async def wait_for_batches(
    engine: AsyncEngine, *, profile: str, on_progress: Callable[[int, int], None]
) -> provider_batches.BatchCounts:
    """Wait until no marked keyword stage is open and no keyword batch of ``profile`` is
    unsettled (``--wait-results``), at most ``BATCH_WAIT_SECONDS``; ``on_progress(open
    stages, open batches)`` after each look (``batch_waits.wait_until_settled``). The batches as
    they ended."""
    return await wait_until_settled(
        engine,
        profile=profile,
        kind="keyword",
        open_work=keyword_batches.open_via_batch,
        on_progress=on_progress,
    )


# Exit code of `reprocess keywords` when the workers did not load the current list in time,
# and of a `--via batch` refused (nothing reset) or without a first batch.
WORKERS_NOT_READY = 1

commands = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Judge finished work again after an operational change (docs/operations.md).",
)


async def stale_plan(operations: Operations) -> ReprocessPlan:
    """How many judgments of the profile in use are older than its current list."""
    return await KeywordReprocess(
        operations.engine, profile=await operations.profile_in_use()
    ).plan()


async def reprocess(
    operations: Operations,
    *,
    rate: int,
    wait: float,
    on_paused: Callable[[], None] | None = None,
    via: Via = Via.SYNC,
    wait_results: bool = False,
) -> ReprocessReport:
    """Wait for the workers, then reset and dispatch (module docstring) under the profile in
    use, printing what happens; ``on_paused`` is called while dispatching is paused (by
    default it says so, and the run waits for `pinlog-core resume`). ``via`` batch: refused
    (``BatchRefused``, nothing reset) while a worker of the profile reports no Batch API for
    its judge or dispatching is paused; the stages are marked, sent, and the first batch's id
    printed (``wait_results``: and their results waited for)."""
    reprocess = KeywordReprocess(operations.engine, profile=await operations.profile_in_use())
    shown: list[str] = []

    def waiting(version, readings) -> None:
        lines = [reading.describe() for reading in readings]
        if lines != shown:
            shown[:] = lines
            typer.echo(f"waiting for every worker to report preset list version {version}:")
            for line in lines:
                typer.echo(f"  {line}")

    def progress(report) -> None:
        typer.echo(
            f"reset {report.reset}/{report.total} (taken {report.taken}, waiting "
            f"{report.waiting}, skipped {report.skipped}) after {report.seconds:.1f} s"
        )

    version = await reprocess.wait_for_workers(
        await operations.reader(), timeout_seconds=wait, on_wait=waiting
    )
    plan = await reprocess.plan(version)
    if via is Via.BATCH:
        return await _reprocess_by_batch(operations, reprocess, plan, wait_results=wait_results)
    typer.echo(
        f"every worker is on preset list version {version} of profile {plan.profile}; "
        f"{plan.stale} context(s) to judge again, {rate} a second at most"
    )
    await operations.refresh_routing()
    return await reprocess.run(
        plan,
        operations.dispatcher(),
        rate=rate,
        on_progress=progress,
        on_paused=on_paused
        or (lambda: typer.echo("dispatch paused: waiting for `pinlog-core resume`")),
    )


async def _reprocess_by_batch(
    operations: Operations,
    reprocess: KeywordReprocess,
    plan: ReprocessPlan,
    *,
    wait_results: bool,
) -> ReprocessReport:
    """``--via batch`` (module docstring): refuse, or mark, send, report the first batch."""
    refuse_batch_unless_taken(await operations.readings(), profile=plan.profile)
    pause = PauseSwitch(operations.engine, operations.metrics)
    if await pause.paused():
        raise BatchRefused(
            "--via batch: dispatching is paused (`pinlog-core resume` first); nothing was reset"
        )
    typer.echo(
        f"every worker is on preset list version {plan.version} of profile {plan.profile}; "
        f"{plan.stale} context(s) to judge again by the provider's Batch API"
    )
    async with autocommit(operations.engine) as conn:
        since = await provider_batches.now(conn)
    await operations.refresh_routing()
    report = await reprocess.run(plan, operations.dispatcher(), rate=BATCH_RESET, via_batch=True)
    if not report.reset:
        return report
    submitted = await submit_by_batch(
        operations, profile=plan.profile, since=since, wait_seconds=SUBMIT_WAIT_SECONDS
    )
    if submitted.first_batch_id is None:
        raise BatchRefused(
            f"reset {report.reset} context(s) for the Batch API, but no worker submitted a "
            f"batch within {SUBMIT_WAIT_SECONDS:g} s; the core processes' backfill loop keeps "
            "sending: look at `pinlog-core status --json` (batches) and the workers' logs"
        )
    typer.echo(
        f"first batch {submitted.first_batch_id} submitted ({submitted.batches.in_progress} "
        f"batch(es) open, {submitted.open_stages} context(s) still to judge); follow with "
        "`pinlog-core status --json` (batches)"
    )
    if wait_results:
        ended = await wait_for_batches(
            operations.engine,
            profile=plan.profile,
            on_progress=lambda stages, open_batches: typer.echo(
                f"waiting: {stages} context(s), {open_batches} batch(es) open"
            ),
        )
        typer.echo(f"batches: {json.dumps(ended.as_json())}")
    report.batch_id = submitted.first_batch_id
    return report


def results_wait_spelling(arguments: list[str]) -> list[str]:
    """``arguments`` (a command line after the program's name) with a bare ``--wait`` of
    ``reprocess keywords`` (no number after it: the spelling ``reembed start --via batch
    --wait`` uses to wait for the results) read as ``--wait-results``; ``--wait SECONDS`` (how
    long to wait for the workers' preset list) is left as it is."""
    words = [a for a in arguments if not a.startswith("-")]
    if words[:2] != ["reprocess", "keywords"]:
        return arguments
    return [
        "--wait-results"
        if argument == "--wait"
        and (index + 1 == len(arguments) or arguments[index + 1].startswith("-"))
        else argument
        for index, argument in enumerate(arguments)
    ]


@commands.command("keywords")
def reprocess_keywords(
    rate: int = typer.Option(
        50,
        "--rate",
        parser=numbers.whole(1, 10_000),
        metavar="N",
        help="Contexts reset per second at most",
    ),
    wait: float = typer.Option(
        120.0,
        "--wait",
        parser=numbers.decimal_seconds(0, numbers.MAX_WAIT_SECONDS),
        metavar="SECONDS",
        help="How long to wait for every worker to load the current preset list",
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="Only count; change nothing"),
    via: Via = typer.Option(
        Via.SYNC,
        "--via",
        help="sync: dispatch the contexts at once, N a second; batch: the workers judge them "
        "by their judge's Batch API (half price, results within 24 hours)",
    ),
    wait_results: bool = typer.Option(
        False,
        "--wait-results",
        help="With --via batch: wait until every batch's results are saved (also spelled "
        "--wait with no number after it)",
    ),
) -> None:
    """Judge again the keywords of every live context judged with an older preset list: wait
    until every worker of PINLOG_CORE_WORKER_BASE_URL reports the current list version, then
    send their keyword stages back to PENDING, N a second, and dispatch them. Reads keep
    showing the previous keywords meanwhile. With --via batch (refused, exit 1, while a
    worker of the profile reports no Batch API for its judge or dispatching is paused) the
    stages are marked for the provider's Batch API: the command waits until the workers
    submitted the first batch, prints its id and exits; contexts reset later go the
    synchronous way."""
    from core_service.settings import ProfileInUseSettings, RescanSettings

    settings = load(ProfileInUseSettings if dry_run else RescanSettings)
    try:
        if dry_run:
            plan = run_operation(settings, stale_plan)
            typer.echo(
                f"preset list version {plan.version} of profile {plan.profile}: would reset "
                f"{plan.stale} context(s) judged with an older list"
            )
            return
        report = run_operation(
            settings,
            lambda ops: reprocess(ops, rate=rate, wait=wait, via=via, wait_results=wait_results),
        )
    except BatchRefused as exc:
        fail(WORKERS_NOT_READY, [str(exc), *(f"  {d}" for d in exc.details)])
    except BatchesStillOpen as exc:
        fail(WORKERS_NOT_READY, [str(exc)])
    except NoUsablePresets:
        fail(
            exit_codes.DATABASE_NOT_READY,
            [
                f"no preset is usable under profile {settings.embedding_profile}: run "
                "`pinlog-ai presets load` with that profile first"
            ],
        )
    except ProfileInUseChanged as exc:
        fail(
            WORKERS_NOT_READY,
            [
                f"{exc}: stopped after resetting {exc.report.reset} context(s); run "
                "`pinlog-core reprocess keywords` again to judge under the new profile"
            ],
        )
    except WorkersNotReady as exc:
        fail(
            WORKERS_NOT_READY,
            [
                f"not every worker reported preset list version {exc.version} within "
                f"{wait:g} s; nothing was reset. Their last answers:",
                *(f"  {reading.describe()}" for reading in exc.readings),
            ],
        )
    if via is Via.BATCH:
        typer.echo(
            f"reset {report.reset} context(s) for preset list version {report.version} by "
            f"batch in {report.seconds:.1f} s, skipped {report.skipped} (changed meanwhile)"
        )
        return
    typer.echo(
        f"reset {report.reset} context(s) for preset list version {report.version} in "
        f"{report.seconds:.1f} s: taken by a worker {report.taken}, left for the rescan "
        f"{report.waiting}, skipped {report.skipped} (changed meanwhile)"
    )
