"""The embedding profile switch as it stands (docs/operations.md "Switching the embedding
profile"): what ``pinlog-core reembed status`` prints and what the backfill loop of every
``serve`` process sets its switch gauges from (``reembed_backfill``). The moves of the switch
are operator commands (``core_service/operations/reembed.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.repository import embedding_switch, provider_batches
from core_service.repository.db import autocommit

# The pace is measured over this window (seconds).
PACE_WINDOW_SECONDS = 60.0


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
    # The provider batches of the profile being filled: {"submitted", "in_progress",
    # "completed", "failed", "items"} (docs/operations.md "Backfill via the Batch API").
    batches: dict[str, int] = field(default_factory=dict)
    via: str = "sync"

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
            "via": self.via,
            "batches": self.batches,
        }


async def read_switch_status(engine: AsyncEngine, *, configured: str) -> ReembedStatus:
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
        batches = await provider_batches.counts(conn, profile=measured, kind="embed")
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
        batches=batches.as_json(),
        via="sync" if row is None else row.via,
    )
