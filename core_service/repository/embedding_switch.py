"""The embedding-profile switch: ``core.embedding_switch`` (0061) and the backfill rows the
core proposes (``ai.context_embedding_backfill``, 0060); docs/operations.md "Switching the
embedding profile", docs/contract.md §1 and §5 (Deviations).

A **live context** is one whose note, record and member are not deleted and whose state row
is not ``CANCELLED``. **Coverage** of a profile: the live contexts with a vector of it that is
not hidden. Each statement here is run alone (autocommit) unless its function says otherwise;
none locks a state row, so none takes part in the lock order of docs/lock-order.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

# Live contexts (module docstring), aliased s (state) and c (context): a FROM and WHERE.
_LIVE_CONTEXTS = """
    FROM ai.context_ai_state AS s
    JOIN core.context AS c ON c.id = s.context_id
    JOIN core.record AS r ON r.id = c.record_id
    JOIN core.member AS m ON m.id = c.member_id
    WHERE c.deleted_at IS NULL AND r.deleted_at IS NULL AND m.deleted_at IS NULL
      AND s.embedding_status <> 'CANCELLED'
"""

# A live vector of context s under :profile exists; the same under :in_use.
_HAS_VECTOR = """EXISTS (SELECT 1 FROM ai.context_embedding AS e
                  WHERE e.context_id = s.context_id AND e.embedding_profile = :profile
                    AND NOT e.is_deleted)"""
_HAS_IN_USE_VECTOR = """EXISTS (SELECT 1 FROM ai.context_embedding AS e
                  WHERE e.context_id = s.context_id AND e.embedding_profile = :in_use
                    AND NOT e.is_deleted)"""

_SWITCH_COLUMNS = """profile_in_use, other_profile, state, rate_per_second, started_at,
                     cut_over_at"""

READ_SWITCH = text("SELECT " + _SWITCH_COLUMNS + " FROM core.embedding_switch WHERE id = 1")

# Begin backfilling :target beside the profile in use (:in_use when no row exists yet);
# only from idle, never to the profile in use (no row is proposed then: the table's CHECK
# would refuse it before the conflict is seen). Returns the row as it is after the statement,
# or nothing when refused.
START_SWITCH = text(
    """
    INSERT INTO core.embedding_switch AS w
        (id, profile_in_use, other_profile, state, rate_per_second, started_at, next_batch_at)
    SELECT 1, CAST(:in_use AS varchar), CAST(:target AS varchar), 'backfilling',
           CAST(:rate AS int), now(), now()
    WHERE CAST(:in_use AS varchar) <> CAST(:target AS varchar)
    ON CONFLICT (id) DO UPDATE SET
        other_profile = EXCLUDED.other_profile,
        state = 'backfilling',
        rate_per_second = EXCLUDED.rate_per_second,
        started_at = now(),
        cut_over_at = NULL,
        next_batch_at = now(),
        updated_at = now()
    WHERE w.state = 'idle' AND w.profile_in_use <> EXCLUDED.other_profile
    RETURNING """
    + _SWITCH_COLUMNS
)

# The other profile becomes the one in use; the previous one is kept complete (rollback).
CUT_OVER = text(
    """
    UPDATE core.embedding_switch
    SET profile_in_use = other_profile, other_profile = profile_in_use, state = 'cut_over',
        cut_over_at = now(), next_batch_at = now(), updated_at = now()
    WHERE id = 1 AND state = 'backfilling'
    RETURNING """
    + _SWITCH_COLUMNS
)

# Back to the profile in use before the switch: from cut_over the two swap back; from
# backfilling the profile in use stays. Either way the switch is idle, the abandoned profile
# kept as other_profile until `reembed finish`.
ROLL_BACK = text(
    """
    UPDATE core.embedding_switch
    SET profile_in_use = CASE WHEN state = 'cut_over' THEN other_profile ELSE profile_in_use END,
        other_profile = CASE WHEN state = 'cut_over' THEN profile_in_use ELSE other_profile END,
        state = 'idle', updated_at = now()
    WHERE id = 1 AND state IN ('backfilling', 'cut_over')
    RETURNING """
    + _SWITCH_COLUMNS
)

# The switch is over: idle, no other profile (its vectors are removed or kept by the caller).
FINISH = text(
    """
    UPDATE core.embedding_switch
    SET other_profile = NULL, state = 'idle', updated_at = now()
    WHERE id = 1 AND state IN ('idle', 'cut_over')
    RETURNING """
    + _SWITCH_COLUMNS
)

# The shared pace (0061): take the next batch slot when it is due and move it on by
# batch / rate seconds (never more than one second of credit saved up); a batch is
# rate_per_second contexts, at most :max_batch, so a slot is about a second at most.
TAKE_BATCH_SLOT = text(
    """
    UPDATE core.embedding_switch
    SET next_batch_at = greatest(next_batch_at, now() - interval '1 second')
                        + make_interval(secs => CAST(least(:max_batch, rate_per_second) AS float8)
                                                / rate_per_second)
    WHERE id = 1 AND state <> 'idle' AND next_batch_at <= now()
    RETURNING profile_in_use, other_profile, state, least(:max_batch, rate_per_second) AS batch
    """
)

# Seconds until the next batch slot is due (0 when due; NULL when idle).
SECONDS_UNTIL_SLOT = text(
    """
    SELECT greatest(extract(epoch FROM next_batch_at - now()), 0) AS seconds
    FROM core.embedding_switch WHERE id = 1 AND state <> 'idle'
    """
)

# Propose a backfill row for every live context without a vector under :profile (only those
# whose embedding stage is COMPLETED when :completed_only: the profile in use, whose live
# stage embeds the others itself); rows that exist are left as they are.
SEED_BACKFILL = text(
    """
    INSERT INTO ai.context_embedding_backfill (embedding_profile, context_id)
    SELECT CAST(:profile AS varchar), s.context_id"""
    + _LIVE_CONTEXTS
    + """
      AND (NOT CAST(:completed_only AS boolean) OR s.embedding_status = 'COMPLETED')
      AND NOT """
    + _HAS_VECTOR
    + """
    ON CONFLICT (embedding_profile, context_id) DO NOTHING
    """
)

# The next :limit open rows of :profile to send to a worker, not sent within :resend_seconds:
# PENDING, or PROCESSING past :expiry_seconds (a worker died holding them). Rows another core
# process is marking are skipped. Those of a context no longer live (module docstring: deleted,
# replaced, its record deleted, its member withdrawn) are closed CANCELLED, never sent: no
# provider call for them; the others are marked sent and returned with what the worker needs.
PROPOSE_BATCH = text(
    """
    WITH picked AS (
        SELECT b.context_id
        FROM ai.context_embedding_backfill AS b
        WHERE b.embedding_profile = :profile AND b.status IN ('PENDING', 'PROCESSING')
          AND (b.requested_at IS NULL
               OR b.requested_at < now() - make_interval(secs => :resend_seconds))
          AND (b.status = 'PENDING'
               OR b.updated_at < now() - make_interval(secs => :expiry_seconds))
        ORDER BY b.context_id
        LIMIT :limit
        FOR UPDATE SKIP LOCKED
    ), judged AS (
        SELECT p.context_id, EXISTS (SELECT 1"""
    + _LIVE_CONTEXTS
    + """ AND s.context_id = p.context_id) AS live
        FROM picked AS p
    ), closed AS (
        UPDATE ai.context_embedding_backfill AS b
        SET status = 'CANCELLED', requested_at = NULL, updated_at = now()
        FROM judged AS j
        WHERE b.embedding_profile = :profile AND b.context_id = j.context_id AND NOT j.live
    ), marked AS (
        UPDATE ai.context_embedding_backfill AS b
        SET requested_at = now()
        FROM judged AS j
        WHERE b.embedding_profile = :profile AND b.context_id = j.context_id AND j.live
        RETURNING b.context_id
    )
    SELECT c.id AS context_id, c.member_id, c.record_id, c.body
    FROM marked AS k
    JOIN core.context AS c ON c.id = k.context_id
    ORDER BY c.id
    """
)

# Rows of a batch no worker took: sendable again at once (a PROCESSING one only once past
# the processing expiry, as before it was sent).
UNMARK_BATCH = text(
    """
    UPDATE ai.context_embedding_backfill
    SET requested_at = NULL
    WHERE embedding_profile = :profile AND context_id = ANY(CAST(:context_ids AS bigint[]))
      AND status IN ('PENDING', 'PROCESSING')
    """
)

# Rows of a batch whose context cannot fit in a request the worker takes (its body limit,
# maxRequestBytes): FAILED with :reason (the note's own fault), never sent again.
FAIL_UNSENDABLE = text(
    """
    UPDATE ai.context_embedding_backfill
    SET status = 'FAILED', failure_reason = :reason, requested_at = NULL, updated_at = now()
    WHERE embedding_profile = :profile AND context_id = ANY(CAST(:context_ids AS bigint[]))
      AND status IN ('PENDING', 'PROCESSING')
    """
)

# Coverage of :profile and of :in_use (module docstring); the backfill's pace over the last
# :window_seconds (rows of :profile completed).
COVERAGE = text(
    """
    SELECT count(*) AS total,
           count(*) FILTER (WHERE """
    + _HAS_VECTOR
    + """) AS done,
           count(*) FILTER (WHERE s.embedding_status = 'COMPLETED' AND NOT """
    + _HAS_IN_USE_VECTOR
    + """) AS missing_in_use,
           (SELECT count(*) FROM ai.context_embedding_backfill AS b
            WHERE b.embedding_profile = :profile AND b.status = 'COMPLETED'
              AND b.updated_at > now() - make_interval(secs => :window_seconds))
               AS completed_recently"""
    + _LIVE_CONTEXTS
)

# Live contexts whose backfill under :profile ended FAILED with no vector, by reason.
FAILED_BY_REASON = text(
    """
    SELECT coalesce(b.failure_reason, 'unknown') AS reason, count(*) AS contexts
    FROM ai.context_embedding_backfill AS b
    JOIN ai.context_ai_state AS s ON s.context_id = b.context_id
    JOIN core.context AS c ON c.id = s.context_id
    JOIN core.record AS r ON r.id = c.record_id
    JOIN core.member AS m ON m.id = c.member_id
    WHERE b.embedding_profile = :profile AND b.status = 'FAILED'
      AND c.deleted_at IS NULL AND r.deleted_at IS NULL AND m.deleted_at IS NULL
      AND s.embedding_status <> 'CANCELLED'
      AND NOT """
    + _HAS_VECTOR
    + """
    GROUP BY 1 ORDER BY 1
    """
)

# Stored vectors by profile (hidden ones apart).
VECTORS_BY_PROFILE = text(
    """
    SELECT embedding_profile AS profile, count(*) FILTER (WHERE NOT is_deleted) AS live,
           count(*) FILTER (WHERE is_deleted) AS hidden
    FROM ai.context_embedding GROUP BY 1 ORDER BY 1
    """
)

# Judgments made before their profile was recorded belong to the profile then in use: :batch
# of them stamped with :profile (repeated until none is left).
STAMP_JUDGMENT_PROFILE = text(
    """
    UPDATE ai.context_keyword_analysis
    SET embedding_profile = :profile
    WHERE context_id IN (SELECT context_id FROM ai.context_keyword_analysis
                         WHERE embedding_profile IS NULL LIMIT :batch)
    """
)

# Up to :batch vectors, backfill rows and preset vectors of profiles other than :in_use,
# removed (repeated until none is left: `reembed finish`).
REMOVE_OTHER_VECTORS = text(
    """
    DELETE FROM ai.context_embedding
    WHERE (context_id, embedding_profile) IN (
        SELECT context_id, embedding_profile FROM ai.context_embedding
        WHERE embedding_profile <> :in_use LIMIT :batch)
    """
)
REMOVE_OTHER_BACKFILL_ROWS = text(
    """
    DELETE FROM ai.context_embedding_backfill
    WHERE (embedding_profile, context_id) IN (
        SELECT embedding_profile, context_id FROM ai.context_embedding_backfill
        WHERE embedding_profile <> :in_use LIMIT :batch)
    """
)
REMOVE_OTHER_PRESET_VECTORS = text(
    "DELETE FROM ai.keyword_preset_embedding WHERE embedding_profile <> :in_use"
)


@dataclass(frozen=True, slots=True)
class SwitchRow:
    """``core.embedding_switch`` (0061); ``state`` idle, backfilling or cut_over."""

    profile_in_use: str
    other_profile: str | None
    state: str
    rate_per_second: int
    started_at: datetime | None
    cut_over_at: datetime | None


@dataclass(frozen=True, slots=True)
class BackfillSource:
    """A proposed context: what the worker needs to embed it."""

    context_id: int
    member_id: int
    record_id: int
    body: str


@dataclass(frozen=True, slots=True)
class Coverage:
    """``total`` live contexts, ``done`` with a vector of the profile, ``missing_in_use``
    with a completed embedding but no vector of the profile in use, ``completed_recently``
    backfill rows completed in the window."""

    total: int
    done: int
    missing_in_use: int
    completed_recently: int


def _switch(row) -> SwitchRow | None:
    if row is None:
        return None
    return SwitchRow(
        row.profile_in_use,
        row.other_profile,
        row.state,
        int(row.rate_per_second),
        row.started_at,
        row.cut_over_at,
    )


async def read(conn: AsyncConnection) -> SwitchRow | None:
    """The switch row; ``None`` before any ``reembed start``."""
    return _switch((await conn.execute(READ_SWITCH)).first())


async def start(conn: AsyncConnection, *, in_use: str, target: str, rate: int) -> SwitchRow | None:
    """Begin a switch to ``target`` (``None``: not idle, or ``target`` is in use)."""
    params = {"in_use": in_use, "target": target, "rate": rate}
    return _switch((await conn.execute(START_SWITCH, params)).first())


async def cut_over(conn: AsyncConnection) -> SwitchRow | None:
    """The other profile in use (``None``: not backfilling)."""
    return _switch((await conn.execute(CUT_OVER)).first())


async def roll_back(conn: AsyncConnection) -> SwitchRow | None:
    """Back to the profile in use before the switch (``None``: no switch to roll back)."""
    return _switch((await conn.execute(ROLL_BACK)).first())


async def finish(conn: AsyncConnection) -> SwitchRow | None:
    """End the switch (``None``: still backfilling, or no row)."""
    return _switch((await conn.execute(FINISH)).first())


@dataclass(frozen=True, slots=True)
class BatchSlot:
    """A taken batch slot: up to ``batch`` contexts may be sent now."""

    profile_in_use: str
    other_profile: str
    batch: int


async def take_batch_slot(conn: AsyncConnection, *, max_batch: int) -> BatchSlot | None:
    """A batch slot when one is due (it is taken), else ``None`` (idle, or not due yet)."""
    row = (await conn.execute(TAKE_BATCH_SLOT, {"max_batch": max_batch})).first()
    if row is None:
        return None
    return BatchSlot(row.profile_in_use, row.other_profile, int(row.batch))


async def seconds_until_slot(conn: AsyncConnection) -> float | None:
    """Seconds until the next batch may go; ``None`` when idle."""
    value = (await conn.execute(SECONDS_UNTIL_SLOT)).scalar()
    return None if value is None else float(value)


async def seed(conn: AsyncConnection, *, profile: str, completed_only: bool) -> int:
    """Propose rows for live contexts lacking a vector of ``profile``; how many were new."""
    params = {"profile": profile, "completed_only": completed_only}
    return (await conn.execute(SEED_BACKFILL, params)).rowcount


async def propose(
    conn: AsyncConnection,
    *,
    profile: str,
    limit: int,
    resend_seconds: float,
    expiry_seconds: float,
) -> list[BackfillSource]:
    """The next open rows of ``profile`` (``PROPOSE_BATCH``) of live contexts, marked sent;
    rows of contexts no longer live are closed ``CANCELLED`` on the way."""
    params = {
        "profile": profile,
        "limit": limit,
        "resend_seconds": float(resend_seconds),
        "expiry_seconds": float(expiry_seconds),
    }
    return [
        BackfillSource(row.context_id, row.member_id, row.record_id, row.body)
        for row in await conn.execute(PROPOSE_BATCH, params)
    ]


async def unmark(conn: AsyncConnection, *, profile: str, context_ids: Sequence[int]) -> None:
    """Make rows no worker took sendable again at once."""
    await conn.execute(UNMARK_BATCH, {"profile": profile, "context_ids": list(context_ids)})


async def fail_unsendable(
    conn: AsyncConnection, *, profile: str, context_ids: Sequence[int], reason: str
) -> None:
    """End rows too large for any request the worker takes ``FAILED`` with ``reason``
    (``FAIL_UNSENDABLE``)."""
    params = {"profile": profile, "context_ids": list(context_ids), "reason": reason}
    await conn.execute(FAIL_UNSENDABLE, params)


async def coverage(
    conn: AsyncConnection, *, profile: str, in_use: str, window_seconds: float
) -> Coverage:
    """Coverage of ``profile`` and what the profile in use lacks (``COVERAGE``)."""
    params = {"profile": profile, "in_use": in_use, "window_seconds": float(window_seconds)}
    row = (await conn.execute(COVERAGE, params)).one()
    return Coverage(
        int(row.total), int(row.done), int(row.missing_in_use), int(row.completed_recently)
    )


async def failed_by_reason(conn: AsyncConnection, *, profile: str) -> dict[str, int]:
    """Live contexts whose backfill of ``profile`` failed, by reason."""
    rows = await conn.execute(FAILED_BY_REASON, {"profile": profile})
    return {row.reason: int(row.contexts) for row in rows}


async def vectors_by_profile(conn: AsyncConnection) -> dict[str, tuple[int, int]]:
    """``{profile: (live, hidden)}`` of the stored context vectors."""
    rows = await conn.execute(VECTORS_BY_PROFILE)
    return {row.profile: (int(row.live), int(row.hidden)) for row in rows}


async def stamp_judgment_profile(conn: AsyncConnection, *, profile: str, batch: int) -> int:
    """Stamp up to ``batch`` judgments without a profile with ``profile``; how many."""
    return (
        await conn.execute(STAMP_JUDGMENT_PROFILE, {"profile": profile, "batch": batch})
    ).rowcount


async def remove_other_profiles(conn: AsyncConnection, *, in_use: str, batch: int) -> int:
    """Remove up to ``batch`` context vectors and up to ``batch`` backfill rows of profiles
    other than ``in_use`` (and every such preset vector); how many rows in all."""
    params = {"in_use": in_use, "batch": batch}
    removed = (await conn.execute(REMOVE_OTHER_VECTORS, params)).rowcount
    removed += (await conn.execute(REMOVE_OTHER_BACKFILL_ROWS, params)).rowcount
    removed += (await conn.execute(REMOVE_OTHER_PRESET_VECTORS, {"in_use": in_use})).rowcount
    return removed
