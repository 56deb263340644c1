"""``ai.context_ai_state``: the worker's transitions, each guarded by its WHERE clause (§2).

Every statement sets ``updated_at = now()`` explicitly (§0 principle 4) and compares times
with the database clock only (FC-06). Column names reach SQL only from ``Stage`` values.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.repository.db import to_array
from app.states import Stage, Status


@dataclass(frozen=True, slots=True)
class ClaimOutcome:
    """Result of one claim: rows affected (0 or 1), the stage's status just before it, and
    the attempt number this claim was given (the fencing token, ``None`` when not claimed).

    ``previous_status`` is ``None`` when there is no state row.
    """

    affected: int
    previous_status: Status | None
    attempt: int | None = None

    @property
    def claimed(self) -> bool:
        return self.affected == 1

    @property
    def reclaimed(self) -> bool:
        """A stale ``PROCESSING`` was taken over: earlier work did not finish in time (§2)."""
        return self.claimed and self.previous_status is Status.PROCESSING


@dataclass(frozen=True, slots=True)
class ContextProgress:
    """Both statuses plus the stored vector (shape ``(dimension,)``) and its profile (§3.1),
    and the owner the core side wrote at create time (``None`` for a row written by a core
    side following the original contract)."""

    embedding_status: Status
    keyword_status: Status
    embedding: np.ndarray | None
    embedding_profile: str | None
    user_id: int | None = None
    record_id: int | None = None

    @property
    def owner_known(self) -> bool:
        return self.user_id is not None and self.record_id is not None

    def is_owned_by(self, user_id: int, record_id: int) -> bool:
        """True when the core's owner is known and equals ``(user_id, record_id)``."""
        return self.owner_known and (self.user_id, self.record_id) == (user_id, record_id)


@dataclass(frozen=True, slots=True)
class LockedState:
    """Both statuses and attempts as seen under ``FOR UPDATE`` in a save (§3.2, §3.3)."""

    embedding_status: Status
    keyword_status: Status
    embedding_attempt: int
    keyword_attempt: int

    def owns(self, stage: Stage, attempt: int) -> bool:
        """True while ``attempt`` is the live claim of ``stage`` (``PROCESSING``, same token)."""
        if stage is Stage.EMBEDDING:
            return self.embedding_status is Status.PROCESSING and self.embedding_attempt == attempt
        return (
            self.embedding_status is Status.COMPLETED
            and self.keyword_status is Status.PROCESSING
            and self.keyword_attempt == attempt
        )


def _claim_statement(stage: Stage) -> TextClause:
    # The CTE locks the row and reads the status before the UPDATE in the same statement,
    # so a fresh start (PENDING) and a reclaim (PROCESSING) can be told apart (§2). Each claim
    # takes the next attempt number: the token its save and fail must still match.
    column, attempt = stage.value, stage.attempt_column
    requires_embedding = "AND s.embedding_status = 'COMPLETED'" if stage is Stage.KEYWORD else ""
    return text(
        f"""
        WITH previous AS (
            SELECT context_id, {column} AS status
            FROM ai.context_ai_state
            WHERE context_id = :context_id
            FOR UPDATE
        ), claimed AS (
            UPDATE ai.context_ai_state AS s
            SET {column} = 'PROCESSING', {attempt} = s.{attempt} + 1, updated_at = now()
            FROM previous AS p
            WHERE s.context_id = p.context_id
              AND s.{column} IN ('PENDING', 'PROCESSING')
              AND (s.{column} = 'PENDING'
                   OR s.updated_at < now() - make_interval(secs => :expiry_seconds))
              {requires_embedding}
            RETURNING s.{attempt} AS attempt
        )
        SELECT p.status AS previous_status, (SELECT count(*) FROM claimed) AS affected,
               (SELECT attempt FROM claimed) AS attempt
        FROM previous AS p
        """  # noqa: S608 - column comes from the Stage enum only
    )


def _complete_statement(stage: Stage) -> TextClause:
    # WHERE kept even after FOR UPDATE: a missed check shows up as 0 rows, not corruption.
    column, attempt = stage.value, stage.attempt_column
    requires_embedding = "AND embedding_status = 'COMPLETED'" if stage is Stage.KEYWORD else ""
    return text(
        f"UPDATE ai.context_ai_state SET {column} = 'COMPLETED', updated_at = now() "  # noqa: S608
        f"WHERE context_id = :context_id AND {column} = 'PROCESSING' "
        f"AND {attempt} = :attempt {requires_embedding}"
    )


def _fail_statement(stage: Stage) -> TextClause:
    # The PROCESSING guard keeps a CANCELLED that arrived meanwhile (CANCELLED wins); the
    # attempt guard keeps a superseded attempt from failing its successor's live claim.
    column, attempt = stage.value, stage.attempt_column
    return text(
        f"UPDATE ai.context_ai_state SET {column} = 'FAILED', updated_at = now() "  # noqa: S608
        f"WHERE context_id = :context_id AND {column} = 'PROCESSING' AND {attempt} = :attempt"
    )


# Start or reclaim one stage (§2 "Start").
CLAIM_STAGE = {stage: _claim_statement(stage) for stage in Stage}
# PROCESSING -> COMPLETED inside a save transaction (§2 "Complete").
COMPLETE_STAGE = {stage: _complete_statement(stage) for stage in Stage}
# PROCESSING -> FAILED for a permanent error (§2 "Fail").
FAIL_STAGE = {stage: _fail_statement(stage) for stage in Stage}

# Pre-check and resume in one read: statuses plus the stored vector and its profile (§3.1).
LOAD_PROGRESS = text(
    """
    SELECT s.embedding_status, s.keyword_status, e.embedding, e.embedding_profile,
           s.user_id, s.record_id
    FROM ai.context_ai_state AS s
    LEFT JOIN ai.context_embedding AS e ON e.context_id = s.context_id
    WHERE s.context_id = :context_id
    """
)

# Lock the state row for a save transaction's re-check (§3.2, §3.3).
LOCK_FOR_SAVE = text(
    """
    SELECT embedding_status, keyword_status, embedding_attempt, keyword_attempt
    FROM ai.context_ai_state
    WHERE context_id = :context_id
    FOR UPDATE
    """
)


def _require_stage(stage: object) -> Stage:
    if not isinstance(stage, Stage):
        raise TypeError(f"stage must be a Stage, got {type(stage).__name__}")
    return stage


async def claim(
    conn: AsyncConnection, stage: Stage, context_id: int, *, expiry_seconds: float
) -> ClaimOutcome:
    """Start ``stage`` (PENDING) or reclaim it (PROCESSING older than ``expiry_seconds``).

    The keyword stage also requires ``embedding_status = 'COMPLETED'``. 0 rows is a normal
    outcome (duplicate, cancelled, finished), never an exception (§2). ``TypeError`` if
    ``stage`` is not a ``Stage``.
    """
    statement = CLAIM_STAGE[_require_stage(stage)]
    result = await conn.execute(
        statement, {"context_id": context_id, "expiry_seconds": float(expiry_seconds)}
    )
    row = result.one_or_none()
    if row is None:
        return ClaimOutcome(affected=0, previous_status=None)
    return ClaimOutcome(
        affected=int(row.affected),
        previous_status=Status(row.previous_status),
        attempt=None if row.attempt is None else int(row.attempt),
    )


async def complete(conn: AsyncConnection, stage: Stage, context_id: int, *, attempt: int) -> int:
    """``PROCESSING -> COMPLETED`` while ``attempt`` is still the stage's live claim (§2);
    returns rows affected (0 or 1)."""
    params = {"context_id": context_id, "attempt": attempt}
    return (await conn.execute(COMPLETE_STAGE[_require_stage(stage)], params)).rowcount


async def fail(conn: AsyncConnection, stage: Stage, context_id: int, *, attempt: int) -> int:
    """``PROCESSING -> FAILED`` for a permanent error found by ``attempt`` (§2); 0 rows when a
    later claim superseded it or the stage left ``PROCESSING``; returns rows affected."""
    params = {"context_id": context_id, "attempt": attempt}
    return (await conn.execute(FAIL_STAGE[_require_stage(stage)], params)).rowcount


async def load_progress(conn: AsyncConnection, context_id: int) -> ContextProgress | None:
    """Read both statuses and the stored vector, without locks (§3.1). ``None``: no row."""
    row = (await conn.execute(LOAD_PROGRESS, {"context_id": context_id})).one_or_none()
    if row is None:
        return None
    return ContextProgress(
        embedding_status=Status(row.embedding_status),
        keyword_status=Status(row.keyword_status),
        embedding=to_array(row.embedding),
        embedding_profile=row.embedding_profile,
        user_id=row.user_id,
        record_id=row.record_id,
    )


async def lock_for_save(conn: AsyncConnection, context_id: int) -> LockedState | None:
    """``SELECT ... FOR UPDATE`` the state row inside a save transaction. ``None``: no row."""
    row = (await conn.execute(LOCK_FOR_SAVE, {"context_id": context_id})).one_or_none()
    if row is None:
        return None
    return LockedState(
        Status(row.embedding_status),
        Status(row.keyword_status),
        int(row.embedding_attempt),
        int(row.keyword_attempt),
    )
