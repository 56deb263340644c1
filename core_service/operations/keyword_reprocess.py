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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import typer
from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.command_startup import fail, load, run_operation
from core_service.composition import Operations
from core_service.repository import context, context_ai_state, embedding_switch, keyword_reprocess
from core_service.repository.db import autocommit, transaction
from core_service.service.dispatch import DispatchOutcome, DispatchRequest, WorkerDispatcher
from core_service.service.worker_readiness import ReadinessReader, WorkerReadiness
from pinlog_platform.cli import exit_codes, numbers

logger = logging.getLogger(__name__)

ORIGIN = "reprocess"
# Dispatches of one batch in flight at once, as the rescan's.
DISPATCH_CONCURRENCY = 8
# How often the workers' /readyz and the pause state are looked at while waiting (seconds).
POLL_SECONDS = 1.0
# Longest wait for refusing workers before a batch and at the end (seconds).
READY_WAIT_SECONDS = 60.0


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
    ``reset_ids`` in the order reset."""

    version: int
    total: int
    reset: int = 0
    taken: int = 0
    waiting: int = 0
    skipped: int = 0
    batches: int = 0
    seconds: float = 0.0
    reset_ids: list[int] = field(default_factory=list)


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
    ) -> ReprocessReport:
        """Reset and dispatch every stale judgment of ``plan``, ``rate`` contexts a second
        at most (module docstring); the report of the whole run. The dispatcher's retry loop
        must run (``start``)."""
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
                    conn, selected, profile=self._profile, version=plan.version
                )
            if not selected:
                break
            after = selected[-1]
            next_batch_at = max(next_batch_at + 1.0, loop.time())
            outcomes = await self._dispatch(dispatcher, reset)
            report.batches += 1
            report.reset += len(reset)
            report.reset_ids.extend(reset)
            report.skipped += len(selected) - len(reset)
            report.taken += sum(outcome.result.ran for outcome in outcomes)
            report.waiting = report.reset - report.taken
            report.seconds = loop.time() - started
            if on_progress is not None:
                on_progress(report)
        if report.reset and not await dispatcher.paused():
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


# Exit code of `reprocess keywords` when the workers did not load the current list in time.
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
) -> ReprocessReport:
    """Wait for the workers, then reset and dispatch (module docstring) under the profile in
    use, printing what happens; ``on_paused`` is called while dispatching is paused (by
    default it says so, and the run waits for `pinlog-core resume`)."""
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
) -> None:
    """Judge again the keywords of every live context judged with an older preset list: wait
    until every worker of PINLOG_CORE_WORKER_BASE_URL reports the current list version, then
    send their keyword stages back to PENDING, N a second, and dispatch them. Reads keep
    showing the previous keywords meanwhile."""
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
        report = run_operation(settings, lambda ops: reprocess(ops, rate=rate, wait=wait))
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
    typer.echo(
        f"reset {report.reset} context(s) for preset list version {report.version} in "
        f"{report.seconds:.1f} s: taken by a worker {report.taken}, left for the rescan "
        f"{report.waiting}, skipped {report.skipped} (changed meanwhile)"
    )
