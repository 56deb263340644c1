"""Switching the embedding profile side by side: ``pinlog-core reembed start | status |
cutover | rollback | finish`` (docs/operations.md "Switching the embedding profile";
docs/contract.md §1 and §5, Deviations).

- **start**: a worker of the target profile must be listed and ready, and presets must be
  usable under it (``pinlog-ai presets load`` with that profile); judgments made before their
  profile was recorded are stamped with the profile in use; the switch row goes to
  ``backfilling`` and backfill rows are proposed for every live context. The core processes'
  backfill loop (``reembed_backfill``) does the rest at ``rate`` contexts a second.
- **status**: coverage of the profile being filled, failures by reason, the measured pace
  and the time left.
- **cutover**: refused until every live context has a vector of the target or a failed
  backfill (``--force`` cuts over earlier); the target becomes the profile in use; the
  previous one stays complete (the loop keeps filling it) so that a rollback loses nothing.
  The caller then re-judges every keyword judgment under the new profile's presets
  (``keyword_reprocess``, no gap: reads keep the previous keywords meanwhile).
- **rollback**: back to the profile in use before the switch; its vectors were kept.
- **finish**: the switch ends; the other profiles' context vectors, backfill rows and preset
  vectors are removed in batches (kept with ``keep_old``).

Each change is one guarded statement, so two operators racing get one winner and a refusal.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.repository import embedding_switch, keyword_reprocess
from core_service.repository.db import autocommit
from core_service.repository.embedding_switch import SwitchRow
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
        }


def _ready_workers_of(readings: Sequence[WorkerReadiness], profile: str) -> list[WorkerReadiness]:
    return [r for r in readings if r.ready and r.profile == profile]


async def profile_in_use(engine: AsyncEngine, *, configured: str) -> str:
    """The profile in use now (no cache): the switch row's, else ``configured``."""
    async with autocommit(engine) as conn:
        row = await embedding_switch.read(conn)
    return configured if row is None else row.profile_in_use


async def status(engine: AsyncEngine, *, configured: str) -> ReembedStatus:
    """The switch and its coverage now (a few statements; operator use, not a hot path)."""
    async with autocommit(engine) as conn:
        row = await embedding_switch.read(conn)
        in_use = configured if row is None else row.profile_in_use
        other = None if row is None else row.other_profile
        state = "idle" if row is None else row.state
        measured = other or in_use
        coverage = await embedding_switch.coverage(
            conn, profile=measured, in_use=in_use, window_seconds=PACE_WINDOW_SECONDS
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
        previous_profile=other if state == "cut_over" else None,
        backfill_profile=other if state != "idle" else None,
        state=state,
        total=coverage.total,
        done=coverage.done,
        failed=failed,
        missing_in_use=coverage.missing_in_use,
        rate_per_second=pace,
        configured_rate=None if row is None else row.rate_per_second,
        eta_seconds=eta,
        vectors={p: {"live": live, "hidden": hidden} for p, (live, hidden) in vectors.items()},
    )


async def start(
    engine: AsyncEngine,
    readings: Sequence[WorkerReadiness],
    *,
    configured: str,
    target: str,
    rate: int,
) -> SwitchRow:
    """Begin the switch to ``target`` (module docstring); ``ReembedRefused`` says why not."""
    in_use = await profile_in_use(engine, configured=configured)
    if target == in_use:
        raise ReembedRefused(f"profile {target} is already in use")
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
        row = await embedding_switch.start(conn, in_use=in_use, target=target, rate=rate)
        if row is None:
            current = await embedding_switch.read(conn)
            state = "unknown" if current is None else current.state
            raise ReembedRefused(
                f"a switch is {state}: cut over and finish it, or roll it back, first"
            )
        while await embedding_switch.stamp_judgment_profile(
            conn, profile=in_use, batch=STAMP_BATCH
        ):
            pass
        await embedding_switch.seed(conn, profile=target, completed_only=False)
        await embedding_switch.seed(conn, profile=in_use, completed_only=True)
    return row


async def cut_over(
    engine: AsyncEngine,
    readings: Sequence[WorkerReadiness],
    *,
    configured: str,
    force: bool,
) -> SwitchRow:
    """Make the target the profile in use (module docstring); ``ReembedRefused`` says why
    not. The caller re-judges the keywords afterwards."""
    now = await status(engine, configured=configured)
    if now.state not in ("backfilling", "ready"):
        raise ReembedRefused(f"nothing to cut over: the switch is {now.state}")
    assert now.target_profile is not None
    if not now.complete and not force:
        raise ReembedRefused(
            f"backfill not complete: {now.done} of {now.total} done, {now.failed_total} failed; "
            "wait, or cut over with --force (contexts without a vector are not found by search "
            "until the backfill reaches them)"
        )
    if not _ready_workers_of(readings, now.target_profile):
        raise ReembedRefused(
            f"no listed worker serves profile {now.target_profile} and is ready",
            [r.describe() for r in readings],
        )
    async with autocommit(engine) as conn:
        row = await embedding_switch.cut_over(conn)
        if row is None:
            raise ReembedRefused(
                "the switch changed meanwhile: look at `pinlog-core reembed status`"
            )
        # Notes embedded under the previous profile in the last seconds get their vector of
        # the new one proposed now, not at the loop's next seeding.
        await embedding_switch.seed(conn, profile=row.profile_in_use, completed_only=True)
        assert row.other_profile is not None  # cut_over (0061's CHECK)
        await embedding_switch.seed(conn, profile=row.other_profile, completed_only=False)
    return row


async def roll_back(engine: AsyncEngine) -> SwitchRow:
    """Back to the profile in use before the switch; ``ReembedRefused`` when none runs."""
    async with autocommit(engine) as conn:
        row = await embedding_switch.roll_back(conn)
    if row is None:
        raise ReembedRefused("no switch to roll back (finished, or never started)")
    return row


async def finish(
    engine: AsyncEngine,
    *,
    keep_old: bool,
    on_progress: Callable[[int], None] | None = None,
) -> tuple[SwitchRow, int]:
    """End the switch and (unless ``keep_old``) remove the other profiles' vectors in
    batches; the row and how many rows were removed. ``ReembedRefused`` while backfilling."""
    async with autocommit(engine) as conn:
        row = await embedding_switch.finish(conn)
        if row is None:
            current = await embedding_switch.read(conn)
            if current is None:
                raise ReembedRefused("no switch to finish")
            raise ReembedRefused(
                f"the switch is {current.state}: cut over (or roll back) before finishing"
            )
    removed = 0
    if keep_old:
        return row, removed
    while True:
        async with autocommit(engine) as conn:
            batch = await embedding_switch.remove_other_profiles(
                conn, in_use=row.profile_in_use, batch=REMOVE_BATCH
            )
        if batch == 0:
            return row, removed
        removed += batch
        if on_progress is not None:
            on_progress(removed)
