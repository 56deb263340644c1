"""``ai.context_ai_state``: the worker's transitions, each guarded by its WHERE clause (§2).

Every statement sets ``updated_at = now()`` explicitly (§0 principle 4) and compares times
with the database clock only (FC-06). Each stage has its own statements, written out in full.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.repository.named_statements import compile_named
from app.repository.stage_pool import StagePool
from pinlog_platform.contract.states import Stage, Status
from pinlog_platform.contract.states.failure_reasons import FailureReason


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


# Each claim's CTE locks the row and reads the status before the UPDATE in the same
# statement, so a fresh start (PENDING) and a reclaim (PROCESSING) can be told apart (§2).
# Each claim takes the next attempt number: the token its save and fail must still match.
# :abandoned_attempt (NULL: none) is an attempt this process gave up while it still owned it
# (a transient fault left the stage PROCESSING, nothing of it runs any more): a PROCESSING
# stage still at that attempt is taken over at once instead of after the expiry.
CLAIM_EMBEDDING = compile_named("""
    WITH previous AS (
        SELECT context_id, embedding_status AS status
        FROM ai.context_ai_state
        WHERE context_id = :context_id
        FOR UPDATE
    ), claimed AS (
        UPDATE ai.context_ai_state AS s
        SET embedding_status = 'PROCESSING', embedding_attempt = s.embedding_attempt + 1,
            updated_at = now()
        FROM previous AS p
        WHERE s.context_id = p.context_id
          AND s.embedding_status IN ('PENDING', 'PROCESSING')
          AND (s.embedding_status = 'PENDING'
               OR s.updated_at < now() - make_interval(secs => :expiry_seconds)
               OR s.embedding_attempt = CAST(:abandoned_attempt AS int))
        RETURNING s.embedding_attempt AS attempt
    )
    SELECT p.status AS previous_status, (SELECT count(*) FROM claimed) AS affected,
           (SELECT attempt FROM claimed) AS attempt
    FROM previous AS p
""")

# The keyword stage also needs the embedding COMPLETED (§2 "Start"). A PROCESSING stage a
# provider batch holds (keyword_batch_id, 0120) is never reclaimed: its batch returns it
# (app.repository.keyword_batches); a claim starts an attempt no batch holds.
CLAIM_KEYWORD = compile_named("""
    WITH previous AS (
        SELECT context_id, keyword_status AS status
        FROM ai.context_ai_state
        WHERE context_id = :context_id
        FOR UPDATE
    ), claimed AS (
        UPDATE ai.context_ai_state AS s
        SET keyword_status = 'PROCESSING', keyword_attempt = s.keyword_attempt + 1,
            keyword_batch_id = NULL, updated_at = now()
        FROM previous AS p
        WHERE s.context_id = p.context_id
          AND s.keyword_status IN ('PENDING', 'PROCESSING')
          AND (s.keyword_status = 'PENDING'
               OR (s.keyword_batch_id IS NULL
                   AND (s.updated_at < now() - make_interval(secs => :expiry_seconds)
                        OR s.keyword_attempt = CAST(:abandoned_attempt AS int))))
          AND s.embedding_status = 'COMPLETED'
        RETURNING s.keyword_attempt AS attempt
    )
    SELECT p.status AS previous_status, (SELECT count(*) FROM claimed) AS affected,
           (SELECT attempt FROM claimed) AS attempt
    FROM previous AS p
""")

# PROCESSING -> FAILED for a permanent error (§2 "Fail"), with its reason code in the same
# statement. The PROCESSING guard keeps a CANCELLED that arrived meanwhile
# (CANCELLED wins); the attempt guard keeps a superseded attempt from failing its successor's
# live claim.
FAIL_EMBEDDING = compile_named("""
    UPDATE ai.context_ai_state
    SET embedding_status = 'FAILED', embedding_failure = :reason, updated_at = now()
    WHERE context_id = :context_id
      AND embedding_status = 'PROCESSING' AND embedding_attempt = :attempt
    RETURNING context_id
""")
FAIL_KEYWORD = compile_named("""
    UPDATE ai.context_ai_state
    SET keyword_status = 'FAILED', keyword_failure = :reason, updated_at = now()
    WHERE context_id = :context_id
      AND keyword_status = 'PROCESSING' AND keyword_attempt = :attempt
    RETURNING context_id
""")

# Start or reclaim one stage (§2 "Start").
CLAIM_STAGE = {Stage.EMBEDDING: CLAIM_EMBEDDING, Stage.KEYWORD: CLAIM_KEYWORD}
FAIL_STAGE = {Stage.EMBEDDING: FAIL_EMBEDDING, Stage.KEYWORD: FAIL_KEYWORD}


def _require_stage(stage: object) -> Stage:
    if not isinstance(stage, Stage):
        raise TypeError(f"stage must be a Stage, got {type(stage).__name__}")
    return stage


async def claim(
    stage_pool: StagePool,
    stage: Stage,
    context_id: int,
    *,
    expiry_seconds: float,
    abandoned_attempt: int | None = None,
) -> ClaimOutcome:
    """Start ``stage`` (PENDING) or reclaim it (PROCESSING older than ``expiry_seconds``, or
    still at ``abandoned_attempt``: an attempt this process gave up, see ``CLAIM_EMBEDDING``).

    The keyword stage also requires ``embedding_status = 'COMPLETED'``. 0 rows is a normal
    outcome (duplicate, cancelled, finished), never an exception (§2). ``TypeError`` if
    ``stage`` is not a ``Stage``.
    """
    statement = CLAIM_STAGE[_require_stage(stage)]
    row = await stage_pool.fetch_row(
        statement,
        context_id=context_id,
        expiry_seconds=float(expiry_seconds),
        abandoned_attempt=abandoned_attempt,
    )
    if row is None:
        return ClaimOutcome(affected=0, previous_status=None)
    attempt = row["attempt"]
    return ClaimOutcome(
        affected=int(row["affected"]),
        previous_status=Status(row["previous_status"]),
        attempt=None if attempt is None else int(attempt),
    )


async def fail(
    stage_pool: StagePool,
    stage: Stage,
    context_id: int,
    *,
    attempt: int,
    reason: FailureReason = FailureReason.UNKNOWN,
) -> int:
    """``PROCESSING -> FAILED`` with ``reason`` for a permanent error found by ``attempt``
    (§2); 0 rows when a later claim superseded it or the stage left ``PROCESSING``; returns
    rows affected."""
    statement = FAIL_STAGE[_require_stage(stage)]
    row = await stage_pool.fetch_row(
        statement, context_id=context_id, attempt=attempt, reason=FailureReason(reason).value
    )
    return 0 if row is None else 1
