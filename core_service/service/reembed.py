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
  reason, the measured pace and the time left.
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.repository import embedding_switch, keyword_reprocess
from core_service.repository.db import autocommit
from core_service.repository.embedding_switch import SwitchRow
from core_service.service.profile_in_use import CACHE_SECONDS
from core_service.service.worker_readiness import WorkerReadiness

# Judgments stamped, and rows removed, per statement.
STAMP_BATCH = 5_000
REMOVE_BATCH = 5_000
# The pace is measured over this window (seconds).
PACE_WINDOW_SECONDS = 60.0


class ReembedRefused(Exception):
    """The operation is not possible now; the message says why and what to do (one line
    per item of ``details``)."""

    def __init__(self, message: str, details: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.details = tuple(details)


@dataclass(frozen=True, slots=True)
class ReembedStatus:
    """What ``reembed status`` shows; ``as_json`` keys are pinned (docs/operations.md)."""

    profile_in_use: str
    target_profile: str | None
    previous_profile: str | None
    backfill_profile: str | None
    state: str
    total: int
    done: int
    failed: dict[str, int]
    missing_in_use: int
    rate_per_second: float
    configured_rate: int | None
    eta_seconds: float | None
    vectors: dict[str, dict[str, int]] = field(default_factory=dict)
    previous_done: int | None = None

    @property
    def failed_total(self) -> int:
        return sum(self.failed.values())

    @property
    def complete(self) -> bool:
        """Every live context has a vector of the backfill profile or a failed backfill."""
        return self.done + self.failed_total >= self.total

    def as_json(self) -> dict[str, object]:
        return {
            "profile_in_use": self.profile_in_use,
            "target_profile": self.target_profile,
            "previous_profile": self.previous_profile,
            "backfill_profile": self.backfill_profile,
            "state": self.state,
            "total": self.total,
            "done": self.done,
            "failed": self.failed,
            "missing_in_use": self.missing_in_use,
            "rate_per_second": round(self.rate_per_second, 2),
            "configured_rate": self.configured_rate,
            "eta_seconds": None if self.eta_seconds is None else round(self.eta_seconds, 1),
            "vectors": self.vectors,
            "previous_done": self.previous_done,
        }


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


async def profile_in_use(engine: AsyncEngine, *, configured: str) -> str:
    """The profile in use now (no cache): the switch row's, else ``configured``."""
    async with autocommit(engine) as conn:
        row = await embedding_switch.read(conn)
    return configured if row is None else row.profile_in_use


async def status(engine: AsyncEngine, *, configured: str) -> ReembedStatus:
    """The switch and its coverage now (a few statements; operator use, not a hot path).
    ``backfill_profile`` is the profile ``done`` counts: the target while backfilling, the
    profile in use in cut_over and rolling_back (what ``finish`` needs complete), none when
    idle (``total``/``done`` are then the profile in use's coverage)."""
    async with autocommit(engine) as conn:
        row = await embedding_switch.read(conn)
        in_use = configured if row is None else row.profile_in_use
        other = None if row is None else row.other_profile
        state = "idle" if row is None else row.state
        measured = other if state == "backfilling" and other is not None else in_use
        previous = other if state in ("cut_over", "rolling_back") else None
        coverage = await embedding_switch.coverage(
            conn,
            profile=measured,
            in_use=in_use,
            window_seconds=PACE_WINDOW_SECONDS,
            previous=previous,
        )
        failed = await embedding_switch.failed_by_reason(conn, profile=measured)
        vectors = await embedding_switch.vectors_by_profile(conn)
    pace = coverage.completed_recently / PACE_WINDOW_SECONDS
    left = max(coverage.total - coverage.done - sum(failed.values()), 0)
    if state == "backfilling" and left == 0:
        state = "ready"
    eta = None
    if left == 0:
        eta = 0.0
    elif pace > 0:
        eta = left / pace
    return ReembedStatus(
        profile_in_use=in_use,
        target_profile={"backfilling": other, "ready": other, "cut_over": in_use}.get(state),
        previous_profile=previous,
        backfill_profile=None if state == "idle" else measured,
        state=state,
        total=coverage.total,
        done=coverage.done,
        failed=failed,
        missing_in_use=coverage.missing_in_use,
        rate_per_second=pace,
        configured_rate=None if row is None else row.rate_per_second,
        eta_seconds=eta,
        vectors={p: {"live": live, "hidden": hidden} for p, (live, hidden) in vectors.items()},
        previous_done=None if previous is None else coverage.previous_done,
    )


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
) -> StartResult:
    """Begin the switch to ``target`` (module docstring); ``ReembedRefused`` says why not.
    While a switch to ``target`` is already backfilling (a ``start`` killed while stamping or
    seeding) this finishes what that run left: ``resumed`` is true."""
    row = await _read(engine)
    in_use = configured if row is None else row.profile_in_use
    if target == in_use:
        raise ReembedRefused(f"profile {target} is already in use")
    resumed = row is not None and row.state == "backfilling" and row.other_profile == target
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
        await embedding_switch.seed(conn, profile=target, completed_only=False)
        await embedding_switch.seed(conn, profile=in_use, completed_only=True)
    return StartResult(row, resumed)


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
        await embedding_switch.seed(conn, profile=moved.profile_in_use, completed_only=True)
        assert moved.other_profile is not None  # cut_over (0061's CHECK)
        await embedding_switch.seed(conn, profile=moved.other_profile, completed_only=False)
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
