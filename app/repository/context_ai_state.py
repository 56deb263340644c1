"""``ai.context_ai_state``: the worker's transitions, each guarded by its WHERE clause (§2).

Every statement sets ``updated_at = now()`` explicitly (§0 principle 4) and compares times
with the database clock only (FC-06). Column names reach SQL only from ``Stage`` values.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import TextClause, text
from sqlalchemy.ext.asyncio import AsyncConnection

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
# PROCESSING -> FAILED for a permanent error (§2 "Fail").
FAIL_STAGE = {stage: _fail_statement(stage) for stage in Stage}


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


async def fail(conn: AsyncConnection, stage: Stage, context_id: int, *, attempt: int) -> int:
    """``PROCESSING -> FAILED`` for a permanent error found by ``attempt`` (§2); 0 rows when a
    later claim superseded it or the stage left ``PROCESSING``; returns rows affected."""
    params = {"context_id": context_id, "attempt": attempt}
    return (await conn.execute(FAIL_STAGE[_require_stage(stage)], params)).rowcount
