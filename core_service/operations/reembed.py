"""Switching the embedding profile side by side: ``pinlog-core reembed start | status |
cutover | rollback | finish`` (docs/operations.md "Switching the embedding profile";
docs/contract.md §1 and §5, Deviations).

- **start**: a worker of the target profile must be listed and ready, and presets must be
  usable under it (``pinlog-ai presets load`` with that profile); the switch row goes to
  ``backfilling``, judgments made before their profile was recorded are stamped with the
  profile in use and backfill rows are proposed for every live context (run again while that
  switch is backfilling, it finishes what a stopped run left). The core processes' backfill
  loop (``reembed_backfill``) does the rest at ``rate`` contexts a second.
- **status**: coverage of the profile ``finish`` or ``cutover`` needs complete, failures by
  reason, the measured pace and the time left (``service/switch_status.py``, which the
  backfill loop's gauges read too).
- **cutover**: refused until every live context has a vector of the target or a failed
  backfill (``--force`` cuts over earlier) and while a judgment is unstamped; the target
  becomes the profile in use; the previous one stays complete (the loop keeps filling it) so
  that a rollback loses nothing. The caller then re-judges every keyword judgment under the
  new profile's presets (``keyword_reprocess``, no gap: reads keep the previous keywords).
- **rollback**: back to the profile in use before the switch; its vectors were kept. From
  ``cut_over`` the switch is ``rolling_back`` until the loop has filled the restored
  profile's gaps (notes processes embedded under the abandoned one while their cached
  profile caught up), then the loop moves it to ``idle``.
- **finish**: the switch ends once every completed live context has a vector of the profile
  in use (failed backfills only with ``force``), none of its backfill rows is open and the
  profile cache window has passed; the other profiles' context vectors (never a context's
  last one), backfill rows and preset vectors are removed in batches (kept with
  ``keep_old``).

Each move is one statement guarded by the generation the command read and by the invariant
it protects (``core_service/repository/embedding_switch.py``), so two operators racing get
one winner and a refusal, and a command whose switch changed meanwhile changes nothing.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

import typer
from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.command_startup import fail, load, run_operation
from core_service.composition import Operations
from core_service.operations import counts
from core_service.operations.batch_waits import (
    SUBMIT_WAIT_SECONDS,
    BatchesStillOpen,
    Via,
    send_marked,
    wait_until_settled,
)
from core_service.operations.keyword_reprocess import (
    KeywordReprocess,
    NoUsablePresets,
    ProfileInUseChanged,
    WorkersNotReady,
    reprocess,
)
from core_service.repository import embedding_switch, keyword_reprocess, provider_batches
from core_service.repository.db import autocommit
from core_service.repository.embedding_switch import SwitchRow
from core_service.service.profile_in_use import CACHE_SECONDS, PROPAGATION_SECONDS
from core_service.service.switch_status import PACE_WINDOW_SECONDS, read_switch_status
from core_service.service.worker_readiness import WorkerReadiness, display_url
from pinlog_platform.cli import numbers

# ``reembed status``'s procedure: the switch as it stands, as the backfill loop's gauges read it.
status = read_switch_status
# Judgments stamped, and rows removed, per statement.
STAMP_BATCH = 5_000
REMOVE_BATCH = 5_000


class ReembedRefused(Exception):
    """The operation is not possible now; the message says why and what to do (one line
    per item of ``details``)."""

    def __init__(self, message: str, details: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.details = tuple(details)


@dataclass(frozen=True, slots=True)
class StartResult:
    """The switch after ``start``; ``resumed``: it was already backfilling to the target."""

    row: SwitchRow
    resumed: bool


@dataclass(frozen=True, slots=True)
class RollbackResult:
    """The switch after ``roll_back``; ``already``: a rollback was under way."""

    row: SwitchRow
    already: bool


def _ready_workers_of(readings: Sequence[WorkerReadiness], profile: str) -> list[WorkerReadiness]:
    return [r for r in readings if r.ready and r.profile == profile]


async def _read(engine: AsyncEngine) -> SwitchRow | None:
    async with autocommit(engine) as conn:
        return await embedding_switch.read(conn)


def _changed_meanwhile() -> ReembedRefused:
    return ReembedRefused("the switch changed meanwhile: look at `pinlog-core reembed status`")


async def start(
    engine: AsyncEngine,
    readings: Sequence[WorkerReadiness],
    *,
    configured: str,
    target: str,
    rate: int,
    via: str = "sync",
) -> StartResult:
    """Begin the switch to ``target`` (module docstring); ``ReembedRefused`` says why not.
    While a switch to ``target`` is already backfilling (a ``start`` killed while stamping or
    seeding) this finishes what that run left: ``resumed`` is true. ``via`` ``batch``: the
    rows proposed now are marked for the provider's Batch API (refused while a worker of
    ``target`` reports ``batch`` false); it is recorded with the switch."""
    row = await _read(engine)
    in_use = configured if row is None else row.profile_in_use
    if target == in_use:
        raise ReembedRefused(f"profile {target} is already in use")
    resumed = row is not None and row.state == "backfilling" and row.other_profile == target
    if resumed and row is not None and row.via != via:
        raise ReembedRefused(
            f"the switch to {target} was started --via {row.via}: run start again with it"
        )
    if via == "batch":
        no_batches = [r for r in readings if r.profile == target and not r.batch]
        if no_batches:
            raise ReembedRefused(
                f"--via batch: these workers of profile {target} report no Batch API "
                "(`batch` false in /readyz; vLLM and Ollama have none, or "
                "PINLOG_EMBEDDING_BATCH_API is false); start with --via sync",
                [display_url(r.base_url) for r in no_batches],
            )
    if row is not None and row.state != "idle" and not resumed:
        raise ReembedRefused(
            f"a switch is {row.state}: cut over and finish it, or roll it back, first"
            if row.state != "rolling_back"
            else "a rollback is under way: wait until `reembed status` says idle"
        )
    if not _ready_workers_of(readings, target):
        raise ReembedRefused(
            f"no listed worker serves profile {target} and is ready: start workers with "
            f"PINLOG_EMBEDDING_PROFILE={target} and list them in PINLOG_CORE_WORKER_BASE_URL",
            [r.describe() for r in readings],
        )
    async with autocommit(engine) as conn:
        if await keyword_reprocess.list_version(conn, target) == 0:
            raise ReembedRefused(
                f"no preset is usable under profile {target}: run `pinlog-ai presets load` "
                "with that profile first"
            )
        if not resumed:
            moved = await embedding_switch.start(
                conn,
                in_use=in_use,
                target=target,
                rate=rate,
                generation=None if row is None else row.generation,
                via=via,
            )
            if moved is None:
                raise _changed_meanwhile()
            row = moved
        assert row is not None
        # Idempotent, so a second run finishes what a killed first one left.
        while await embedding_switch.stamp_judgment_profile(
            conn, profile=in_use, batch=STAMP_BATCH
        ):
            pass
        # Notes from before the core recorded their digest and owner: a backfill worker
        # claims only those the core vouches for.
        while await embedding_switch.vouch_state_rows(conn, batch=STAMP_BATCH):
            pass
        # Proposed only while the switch is still the one read (a rollback or finish that
        # committed meanwhile leaves nothing behind), which is checked again after.
        await embedding_switch.seed(
            conn,
            profile=target,
            completed_only=False,
            generation=row.generation,
            via_batch=via == "batch",
        )
        await embedding_switch.seed(
            conn, profile=in_use, completed_only=True, generation=row.generation
        )
        if await embedding_switch.read(conn) != row:
            raise _changed_meanwhile()
    return StartResult(row, resumed)


@dataclass(frozen=True, slots=True)
class Submitted:
    """What ``submit_by_batch`` saw: the first batch submitted since the start (``None``:
    none within the wait), the batches of the profile by state, and whether dispatching is
    paused (nothing is sent then)."""

    first_batch_id: str | None
    batches: provider_batches.BatchCounts
    paused: bool = False


async def submit_by_batch(
    operations: Operations, *, profile: str, since: datetime, wait_seconds: float
) -> Submitted:
    """Send the rows ``start --via batch`` marked to the workers of ``profile`` (each request
    one provider batch they submit; ``ReembedBackfill.send_by_batch``) until none is left to
    send or ``wait_seconds`` passed; the first batch submitted since ``since``. The core
    processes' backfill loops send what is left (a worker that refused, a row unsent)."""
    pause = await send_marked(
        operations, lambda loop: loop.send_by_batch(), wait_seconds=wait_seconds
    )
    async with autocommit(operations.engine) as conn:
        first = await provider_batches.first_since(conn, profile=profile, since=since)
        counts_now = await provider_batches.counts(conn, profile=profile, kind="embed")
    return Submitted(first, counts_now, paused=await pause.paused())


async def wait_for_batches(
    engine: AsyncEngine, *, profile: str, on_progress: Callable[[int, int], None]
) -> provider_batches.BatchCounts:
    """Wait until no row of ``profile`` marked for the Batch API is open and no batch of it
    is unsettled (``--wait``), at most ``BATCH_WAIT_SECONDS``; ``on_progress(open rows, open
    batches)`` after each look (``batch_waits.wait_until_settled``). The batches as they
    ended."""
    return await wait_until_settled(
        engine,
        profile=profile,
        kind="embed",
        open_work=lambda conn: embedding_switch.open_via_batch(conn, profile=profile),
        on_progress=on_progress,
    )


async def cut_over(
    engine: AsyncEngine,
    readings: Sequence[WorkerReadiness],
    *,
    configured: str,
    force: bool,
) -> SwitchRow:
    """Make the target the profile in use (module docstring); ``ReembedRefused`` says why
    not. The caller re-judges the keywords afterwards. The move (``CUT_OVER``) re-checks the
    generation read and the target's coverage itself."""
    row = await _read(engine)
    if row is None or row.state != "backfilling":
        state = "idle" if row is None else row.state
        raise ReembedRefused(
            f"nothing to cut over: the switch is {state}"
            + (" (a rollback is under way)" if state == "rolling_back" else "")
        )
    now = await status(engine, configured=configured)
    assert row.other_profile is not None
    if not now.complete and not force:
        raise ReembedRefused(
            f"backfill not complete: {now.done} of {now.total} done, {now.failed_total} failed; "
            "wait, or cut over with --force (contexts without a vector are not found by search "
            "until the backfill reaches them)"
        )
    if not _ready_workers_of(readings, row.other_profile):
        raise ReembedRefused(
            f"no listed worker serves profile {row.other_profile} and is ready",
            [r.describe() for r in readings],
        )
    async with autocommit(engine) as conn:
        moved = await embedding_switch.cut_over(
            conn, generation=row.generation, target=row.other_profile, force=force
        )
        if moved is None:
            current = await embedding_switch.read(conn)
            if current != row:
                raise _changed_meanwhile()
            if await embedding_switch.unstamped_judgments(conn):
                raise ReembedRefused(
                    "judgments without their profile are left (a `reembed start` was stopped "
                    f"while stamping them): run `pinlog-core reembed start --profile "
                    f"{row.other_profile}` again, then cut over"
                )
            raise ReembedRefused(
                "backfill not complete (a context lost its vector meanwhile): look at "
                "`pinlog-core reembed status`"
            )
        # Notes embedded under the previous profile in the last seconds get their vector of
        # the new one proposed now, not at the loop's next seeding.
        await embedding_switch.seed(
            conn, profile=moved.profile_in_use, completed_only=True, generation=moved.generation
        )
        assert moved.other_profile is not None  # cut_over (0061's CHECK)
        await embedding_switch.seed(
            conn, profile=moved.other_profile, completed_only=False, generation=moved.generation
        )
    return moved


async def roll_back(engine: AsyncEngine) -> RollbackResult:
    """Back to the profile in use before the switch (module docstring): from backfilling the
    switch is idle at once, from cut_over it is rolling_back (the backfill loop moves it to
    idle). ``already`` is true when a rollback was under way. ``ReembedRefused`` when there is
    nothing to roll back, or the row changed meanwhile."""
    row = await _read(engine)
    if row is not None and row.state == "rolling_back":
        return RollbackResult(row, already=True)
    if row is None or row.state not in ("backfilling", "cut_over"):
        raise ReembedRefused("no switch to roll back (finished, or never started)")
    async with autocommit(engine) as conn:
        moved = await embedding_switch.roll_back(conn, generation=row.generation)
        if moved is not None:
            # The abandoned profile's open provider batches: the workers cancel them and
            # discard what they return.
            await provider_batches.request_cancel(conn, profile=moved.other_profile)
    if moved is None:
        raise _changed_meanwhile()
    return RollbackResult(moved, already=False)


async def finish(
    engine: AsyncEngine,
    *,
    keep_old: bool,
    force: bool = False,
    on_progress: Callable[[int], None] | None = None,
    on_waiting: Callable[[float], None] | None = None,
    window_seconds: float = CACHE_SECONDS,
) -> tuple[SwitchRow, int]:
    """End the switch and (unless ``keep_old``) remove the other profiles' vectors in
    batches, never a context's last live vector; the row and how many rows were removed.

    ``ReembedRefused`` (with what is left) while backfilling or rolling back, while a live
    context whose embedding stage is COMPLETED lacks a live vector of the profile in use
    (``missing_in_use``; those whose backfill FAILED are listed and pass with ``force``), or
    while a backfill row of the profile in use is open, or while an embedding stage sent
    before every process acted on the profile in use is still open. It moves only once the
    switch has not changed for ``window_seconds`` (the profile cache window: every process
    acts on the profile in use; it waits for the rest, ``on_waiting`` told the seconds), in
    one statement that re-checks all of this against the generation read (``FINISH``)."""
    row = await _read(engine)
    if row is None:
        raise ReembedRefused("no switch to finish")
    if row.state not in ("idle", "cut_over"):
        raise ReembedRefused(
            f"the switch is {row.state}: "
            + (
                "wait until the rollback is done (`reembed status` says idle)"
                if row.state == "rolling_back"
                else "cut over (or roll back) before finishing"
            )
        )
    left = window_seconds - row.changed_seconds_ago
    if left > 0:
        if on_waiting is not None:
            on_waiting(left)
        await asyncio.sleep(left + 0.1)
    async with autocommit(engine) as conn:
        moved = await embedding_switch.finish(
            conn,
            generation=row.generation,
            in_use=row.profile_in_use,
            force=force,
            window_seconds=window_seconds,
        )
        if moved is None:
            raise await _finish_refused(conn, row, force=force, window_seconds=window_seconds)
        await provider_batches.request_cancel(conn, keep=moved.profile_in_use)
    removed = 0
    if keep_old:
        return moved, removed
    while True:
        async with autocommit(engine) as conn:
            batch = await embedding_switch.remove_other_profiles(
                conn, in_use=moved.profile_in_use, generation=moved.generation, batch=REMOVE_BATCH
            )
        if batch == 0:
            return moved, removed
        removed += batch
        if on_progress is not None:
            on_progress(removed)


async def _finish_refused(
    conn, seen: SwitchRow, *, force: bool, window_seconds: float
) -> ReembedRefused:
    """Why ``FINISH`` refused: the row changed, or what is left."""
    current = await embedding_switch.read(conn)
    if current != seen:
        return _changed_meanwhile()
    in_use = seen.profile_in_use
    coverage = await embedding_switch.coverage(
        conn, profile=in_use, in_use=in_use, window_seconds=PACE_WINDOW_SECONDS
    )
    failed = await embedding_switch.failed_by_reason(conn, profile=in_use)
    open_rows = await embedding_switch.open_backfill(conn, profile=in_use)
    in_flight = await embedding_switch.stages_open_from_before(conn, window_seconds=window_seconds)
    failed_total = sum(failed.values())
    details = []
    if failed:
        details.append(
            f"failed backfills of {in_use}: "
            + " ".join(f"{reason}={n}" for reason, n in sorted(failed.items()))
        )
    waiting = coverage.missing_in_use - (failed_total if force else 0)
    return ReembedRefused(
        f"not finished: {max(waiting, 0)} live note(s) lack a vector of the profile in use "
        f"{in_use} ({failed_total} of them failed: finish with --force to keep their old "
        f"vector), {open_rows} backfill row(s) of it open, {in_flight} note(s) sent to be "
        "embedded before every process used it still open; wait for the backfill "
        "(`reembed status`) and finish again",
        details,
    )


# Exit code of a `reembed` operation refused in the current state.
REEMBED_REFUSED = 1
# Seconds between two re-judging passes after a cutover or rollback.
REJUDGE_PASS_SECONDS = 5.0

commands = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Switch the embedding profile side by side (docs/operations.md)",
)


def _run(settings, step):
    """Run ``step(operations)``; a refusal ends the command with ``REEMBED_REFUSED`` and its
    reasons on stderr."""
    try:
        return run_operation(settings, step)
    except ReembedRefused as exc:
        fail(REEMBED_REFUSED, [str(exc), *(f"  {d}" for d in exc.details)])


@commands.command("start")
def reembed_start(
    profile: str = typer.Option(
        ..., "--profile", metavar="PROFILE", help="The embedding profile to switch to"
    ),
    rate: int = typer.Option(
        50,
        "--rate",
        parser=numbers.whole(1, 10_000),
        metavar="N",
        help="Contexts embedded per second at most",
    ),
    via: Via = typer.Option(
        Via.SYNC,
        "--via",
        help="sync: the workers embed the contexts at once, N a second; batch: they submit "
        "them to the provider's Batch API (half price, results within 24 hours)",
    ),
    wait: bool = typer.Option(
        False, "--wait", help="With --via batch: wait until every batch's results are saved"
    ),
) -> None:
    """Start embedding every live context under PROFILE beside the profile in use. Workers of
    PROFILE must be listed in PINLOG_CORE_WORKER_BASE_URL and its presets loaded; the core
    processes' backfill loop then runs at N contexts a second. Watch `reembed status`. Run
    again while that switch is backfilling, it finishes what a stopped first run left. With
    --via batch the contexts go to the provider's Batch API (refused, exit 1, while a worker of
    PROFILE reports no Batch API): the command waits until the workers submitted the first
    batch, prints its id and exits; notes saved after the start go the synchronous way."""
    from core_service.settings import RescanSettings

    settings = load(RescanSettings)

    async def step(ops: Operations) -> tuple[StartResult, Submitted | None]:
        async with autocommit(ops.engine) as conn:
            since = await provider_batches.now(conn)
        started = await start(
            ops.engine,
            await ops.readings(),
            configured=settings.embedding_profile,
            target=profile,
            rate=rate,
            via=via.value,
        )
        if via is not Via.BATCH:
            return started, None
        submitted = await submit_by_batch(
            ops, profile=profile, since=since, wait_seconds=SUBMIT_WAIT_SECONDS
        )
        if submitted.first_batch_id is None and submitted.paused:
            raise ReembedRefused(
                f"backfilling {profile} by batch, but dispatching is paused: the notes are "
                "sent once it is resumed (`pinlog-core resume`)"
            )
        if submitted.first_batch_id is None:
            raise ReembedRefused(
                f"backfilling {profile} by batch, but no worker submitted a batch within "
                f"{SUBMIT_WAIT_SECONDS:g} s; the core processes' backfill loop keeps sending: "
                "look at `pinlog-core reembed status` (batches) and the workers' logs"
            )
        typer.echo(
            f"first batch {submitted.first_batch_id} submitted "
            f"({submitted.batches.in_progress} batch(es) open, {submitted.batches.items} "
            "context(s)); follow with `pinlog-core reembed status` (batches), then "
            "`reembed cutover`"
        )
        if wait:
            try:
                ended = await wait_for_batches(
                    ops.engine,
                    profile=profile,
                    on_progress=lambda rows, open_batches: typer.echo(
                        f"waiting: {rows} context(s) in {open_batches} batch(es) open"
                    ),
                )
            except BatchesStillOpen as exc:
                raise ReembedRefused(str(exc)) from None
            typer.echo(f"batches: {json.dumps(ended.as_json())}")
        return started, submitted

    result, submitted = _run(settings, step)
    row = result.row
    if submitted is not None:
        return
    if result.resumed:
        typer.echo(
            f"profile {row.other_profile} was already backfilling beside {row.profile_in_use} "
            f"at {row.rate_per_second} context(s) a second; judgments stamped and contexts "
            "proposed (what an earlier run left)"
        )
        return
    typer.echo(
        f"backfilling profile {row.other_profile} beside {row.profile_in_use} at {rate} "
        "context(s) a second; watch `pinlog-core reembed status`, then `reembed cutover`"
    )


@commands.command("status")
def reembed_status(
    as_json: bool = typer.Option(False, "--json", help="One JSON object (docs/operations.md)"),
) -> None:
    """The switch: profiles, state (idle, backfilling, ready, cut_over, rolling_back), coverage
    of the profile being filled (the target while backfilling, the profile in use after a
    cutover or rollback), failures by reason, pace and time left; a progress bar when attached
    to a terminal."""
    from core_service.settings import ProfileInUseSettings

    settings = load(ProfileInUseSettings)
    report = _run(settings, lambda ops: status(ops.engine, configured=settings.embedding_profile))
    if as_json:
        typer.echo(json.dumps(report.as_json()))
        return
    typer.echo(f"profile in use: {report.profile_in_use}")
    typer.echo(f"state: {report.state}")
    if report.backfill_profile is not None:
        typer.echo(f"filling profile: {report.backfill_profile}")
        settled = report.done + report.failed_total
        if sys.stdout.isatty():
            typer.echo(_progress_bar(settled, report.total))
        typer.echo(f"done {report.done} of {report.total}, failed {report.failed_total}"
                   + (f" ({counts(report.failed)})" if report.failed else ""))  # fmt: skip
        eta = "unknown" if report.eta_seconds is None else f"{report.eta_seconds:.0f} s"
        typer.echo(f"pace {report.rate_per_second:.1f}/s (set {report.configured_rate}/s), "
                   f"time left {eta}")  # fmt: skip
    if report.previous_profile is not None:
        typer.echo(f"previous profile {report.previous_profile}: {report.previous_done} of "
                   f"{report.total} with a vector")  # fmt: skip
    if report.missing_in_use:
        typer.echo(f"live contexts without a vector of the profile in use: {report.missing_in_use}")
    for name, vectors in report.vectors.items():
        typer.echo(f"vectors of {name}: {vectors['live']} live, {vectors['hidden']} hidden")
    if report.batches.get("submitted"):
        typer.echo(f"provider batches (via {report.via}): {counts(report.batches)}")


def _progress_bar(done: int, total: int, width: int = 40) -> str:
    share = 1.0 if total == 0 else min(done / total, 1.0)
    filled = int(share * width)
    return f"[{'#' * filled}{'.' * (width - filled)}] {share * 100:5.1f}%"


def _rejudge_rate_option():
    return typer.Option(
        50,
        "--rejudge-rate",
        min=1,
        max=10_000,
        metavar="N",
        help="Contexts whose keywords are judged again per second at most",
    )


def _wait_option(help_text: str):
    return typer.Option(
        120.0,
        "--wait",
        parser=numbers.decimal_seconds(0, numbers.MAX_WAIT_SECONDS),
        metavar="SECONDS",
        help=help_text,
    )


@commands.command("cutover")
def reembed_cutover(
    force: bool = typer.Option(False, "--force", help="Cut over before the backfill is done"),
    wait: float = _wait_option(
        "How long to wait for the re-judging (and the workers of the new profile)"
    ),
    rejudge_rate: int = _rejudge_rate_option(),
) -> None:
    """Make the target profile the one in use (search, judgments, new work), then judge every
    context's keywords again under its presets, N a second (reads keep the previous keywords
    meanwhile). Refused until every live context has a vector of it or a failed backfill.
    Exits 1 saying what is left when the re-judging is not done within --wait."""
    from core_service.settings import RescanSettings

    settings = load(RescanSettings)

    async def step(ops: Operations) -> None:
        row = await cut_over(
            ops.engine, await ops.readings(), configured=settings.embedding_profile, force=force
        )
        typer.echo(f"profile in use: {row.profile_in_use} (was {row.other_profile}); "
                   f"{row.other_profile} is kept complete until `reembed finish`")  # fmt: skip
        await rejudge_after_switch(ops, rate=rejudge_rate, wait=wait, until_idle=False)

    _run(settings, step)


@commands.command("rollback")
def reembed_rollback(
    wait: float = _wait_option(
        "How long to wait for the rollback to end (idle) and its re-judging"
    ),
    rejudge_rate: int = _rejudge_rate_option(),
) -> None:
    """Go back to the profile in use before the switch (any time before `reembed finish`);
    judgments made under the abandoned profile are made again, N a second. After a cutover the
    switch is rolling_back until every note has a vector of the restored profile (the core
    processes' backfill loop fills the gaps, then moves it to idle). Exits 1 saying what is
    left when that and the re-judging are not done within --wait."""
    from core_service.settings import RescanSettings

    settings = load(RescanSettings)

    async def step(ops: Operations) -> None:
        result = await roll_back(ops.engine)
        row = result.row
        if result.already:
            typer.echo(
                f"already rolling back to {row.profile_in_use} ({row.other_profile} abandoned): "
                "watch `pinlog-core reembed status` until it says idle"
            )
            return
        typer.echo(f"profile in use: {row.profile_in_use}; {row.other_profile} abandoned "
                   "(its vectors are removed by `reembed finish`)")  # fmt: skip
        await rejudge_after_switch(
            ops, rate=rejudge_rate, wait=wait, until_idle=row.state == "rolling_back"
        )

    _run(settings, step)


class _DispatchPaused(Exception):
    """Dispatching is paused: the re-judging cannot go on (``rejudge_after_switch``)."""


def _stop_paused() -> None:
    raise _DispatchPaused


@dataclass(frozen=True)
class JudgmentsLeft:
    """Stale judgments under the profile in use, completed notes without its vector, and the
    switch's state."""

    stale: int
    missing: int
    state: str

    def line(self) -> str:
        return (
            f"left: {self.stale} judgment(s) of another profile, {self.missing} note(s) "
            f"without a vector of the profile in use, switch {self.state}"
        )


async def judgments_left(operations: Operations) -> JudgmentsLeft:
    """What the re-judging after a switch still has to do (``JudgmentsLeft``)."""
    now = await status(operations.engine, configured=operations.settings.embedding_profile)
    plan = await KeywordReprocess(operations.engine, profile=now.profile_in_use).plan()
    return JudgmentsLeft(plan.stale, now.missing_in_use, now.state)


async def rejudge_after_switch(
    operations: Operations, *, rate: int, wait: float, until_idle: bool
) -> None:
    """Once every core process acts on the new profile, judge again every judgment made
    under another one (`reprocess keywords`' path, ``rate`` a second), until none is left,
    no completed note lacks a vector of the profile in use and (``until_idle``) the switch
    is idle. Exits ``REEMBED_REFUSED`` saying what is left when that is not so within
    ``wait`` seconds, or at once while dispatching is paused."""
    deadline = time.monotonic() + wait
    typer.echo(f"waiting {PROPAGATION_SECONDS:g} s for every core process to use it")
    await asyncio.sleep(PROPAGATION_SECONDS)
    reset = taken = 0
    while True:
        try:
            report = await reprocess(
                operations,
                rate=rate,
                wait=max(deadline - time.monotonic(), 0.0),
                on_paused=_stop_paused,
            )
        except (NoUsablePresets, WorkersNotReady, ProfileInUseChanged) as exc:
            await _stopped_short(
                operations,
                f"keywords not judged again yet ({type(exc).__name__}); run "
                "`pinlog-core reprocess keywords` once the workers of the profile are ready",
            )
        except _DispatchPaused:
            await _stopped_short(
                operations,
                "dispatching is paused (`pinlog-core resume`); run `pinlog-core reprocess "
                "keywords` once it is resumed",
            )
        reset, taken = reset + report.reset, taken + report.taken
        # Notes judged under the previous profile while the change spread, or waiting for
        # their vector of the new one, are judged again once they have it.
        left = await judgments_left(operations)
        if left.stale == 0 and left.missing == 0 and (not until_idle or left.state == "idle"):
            break
        if time.monotonic() >= deadline:
            await _stopped_short(operations, f"not done within --wait {wait:g} s", left)
        typer.echo(f"{left.line()}; judging again in {REJUDGE_PASS_SECONDS:g} s")
        await asyncio.sleep(min(REJUDGE_PASS_SECONDS, max(deadline - time.monotonic(), 0.0)))
    typer.echo(f"judged again: {reset} context(s) reset, {taken} taken by a worker")


async def _stopped_short(
    operations: Operations, reason: str, left: JudgmentsLeft | None = None
) -> None:
    """Exit ``REEMBED_REFUSED`` with ``reason`` and what is left."""
    if left is None:
        left = await judgments_left(operations)
    fail(REEMBED_REFUSED, [reason, left.line()])


@commands.command("finish")
def reembed_finish(
    keep_old: bool = typer.Option(
        False, "--keep-old", help="End the switch but keep the other profiles' vectors"
    ),
    force: bool = typer.Option(
        False,
        "--force",
        help="Finish although some notes' backfill of the profile in use failed (their old "
        "vector is kept)",
    ),
) -> None:
    """End the switch: remove the other profiles' context vectors, backfill rows and preset
    vectors in batches (kept with --keep-old), never a note's last vector. Refused while
    backfilling or rolling back, while a completed note lacks a vector of the profile in use
    or a backfill of it is open (failed backfills are listed and need --force); starts once
    the switch has not changed for the profile cache window."""
    from core_service.settings import ProfileInUseSettings

    settings = load(ProfileInUseSettings)

    def progress(removed: int) -> None:
        typer.echo(f"removed {removed} row(s)")

    def waiting(seconds: float) -> None:
        typer.echo(f"waiting {seconds:.1f} s for every core process to use the profile in use")

    row, removed = _run(
        settings,
        lambda ops: finish(
            ops.engine, keep_old=keep_old, force=force, on_progress=progress, on_waiting=waiting
        ),
    )
    kept = " (other profiles' vectors kept)" if keep_old else f"; removed {removed} row(s)"
    typer.echo(f"switch finished: profile in use {row.profile_in_use}{kept}")
