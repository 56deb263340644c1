"""``ai.context_ai_state`` as the core service writes it (§0, §2, §9).

The core side creates rows (``PENDING``/``PENDING``/0), cancels them, spends ``retry_count``
and finalizes exhausted work. It never writes ``PROCESSING`` or ``COMPLETED``, nor a stage's
attempt column. Each statement below is one ``pinlog_platform.states.CoreOperation``;
``CORE_TRANSITIONS`` is what it may do to a stage's status, and
``tests/core/repository/test_core_transition_table.py`` drives it from every status. Multi-row
statements lock in ``context_id`` order (waiting) or skip locked rows (the scheduler), so they
can never deadlock with each other or with a worker's save (docs/lock-order.md).

Staleness is judged by the stage that would run next (embedding while unfinished, else keyword
once embedding is ``COMPLETED``): ``PENDING`` older than the pending expiry, ``PROCESSING``
older than the processing expiry, measured on ``updated_at`` (the worker's progress clock) and
on ``rescanned_at`` (the last re-request), both with the database clock (FC-06). The rescan
never writes ``updated_at``: the worker's reclaim rule (§2) must still see the stage as stale
when the rescan's request arrives (docs/rescan.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from pinlog_platform.states.failure_reasons import FailureReason

# Create: both stages PENDING, no retries spent, the owner as the core knows it (§9 Create).
INSERT_PENDING_STATE = text(
    """
    INSERT INTO ai.context_ai_state
        (context_id, embedding_status, keyword_status, retry_count, updated_at, user_id, record_id)
    VALUES (:context_id, 'PENDING', 'PENDING', 0, now(), :user_id, :record_id)
    """
)

# Cancel whatever the statuses were (§9 Delete); rows locked in id order first.
CANCEL_STATES = text(
    """
    WITH locked AS (
        SELECT context_id FROM ai.context_ai_state
        WHERE context_id = ANY(CAST(:context_ids AS bigint[]))
        ORDER BY context_id
        FOR UPDATE
    )
    UPDATE ai.context_ai_state AS s
    SET embedding_status = 'CANCELLED', keyword_status = 'CANCELLED', updated_at = now()
    FROM locked
    WHERE s.context_id = locked.context_id
    """
)

# A row whose next stage is stale (module docstring); shared by the rescan and the finalizer.
_NEXT_STAGE_IS_STALE = """
    (CASE
        WHEN embedding_status IN ('PENDING', 'PROCESSING') THEN embedding_status
        WHEN embedding_status = 'COMPLETED' THEN keyword_status
     END = 'PENDING'
     AND greatest(updated_at, coalesce(rescanned_at, updated_at))
         < now() - make_interval(secs => :pending_expiry_seconds)
    OR
     CASE
        WHEN embedding_status IN ('PENDING', 'PROCESSING') THEN embedding_status
        WHEN embedding_status = 'COMPLETED' THEN keyword_status
     END = 'PROCESSING'
     AND greatest(updated_at, coalesce(rescanned_at, updated_at))
         < now() - make_interval(secs => :processing_expiry_seconds))
"""

# Rescan claim (§9 steps 2-3): stale rows with retries left, skipping rows locked elsewhere,
# spend one retry and stamp rescanned_at; updated_at is deliberately untouched.
CLAIM_STALE = text(
    """
    WITH stale AS (
        SELECT context_id FROM ai.context_ai_state
        WHERE retry_count < :max_retry AND """
    + _NEXT_STAGE_IS_STALE
    + """
        ORDER BY updated_at, context_id
        LIMIT :batch_size
        FOR UPDATE SKIP LOCKED
    )
    UPDATE ai.context_ai_state AS s
    SET retry_count = s.retry_count + 1, rescanned_at = now()
    FROM stale
    WHERE s.context_id = stale.context_id
    RETURNING s.context_id, s.retry_count
    """
)

# Finalizer (§9 step 1): exhausted stale rows get their unfinished stages FAILED with the
# reason :reason (retries_exhausted, H2 item 4), by whitelist, so COMPLETED, FAILED and
# CANCELLED are never overwritten.
FINALIZE_EXHAUSTED = text(
    """
    WITH exhausted AS (
        SELECT context_id FROM ai.context_ai_state
        WHERE retry_count >= :max_retry AND """
    + _NEXT_STAGE_IS_STALE
    + """
        ORDER BY context_id
        LIMIT :batch_size
        FOR UPDATE SKIP LOCKED
    )
    UPDATE ai.context_ai_state AS s
    SET embedding_status = CASE WHEN s.embedding_status IN ('PENDING', 'PROCESSING')
                                THEN 'FAILED' ELSE s.embedding_status END,
        embedding_failure = CASE WHEN s.embedding_status IN ('PENDING', 'PROCESSING')
                                 THEN :reason ELSE s.embedding_failure END,
        keyword_status = CASE WHEN s.keyword_status IN ('PENDING', 'PROCESSING')
                              THEN 'FAILED' ELSE s.keyword_status END,
        keyword_failure = CASE WHEN s.keyword_status IN ('PENDING', 'PROCESSING')
                               THEN :reason ELSE s.keyword_failure END,
        updated_at = now()
    FROM exhausted
    WHERE s.context_id = exhausted.context_id
    RETURNING s.context_id
    """
)

# A keyword stage that can never run (its claim needs embedding COMPLETED, but the embedding
# stage FAILED for good) is closed at once with the reason :reason (embedding_failed) instead
# of being re-requested (docs/rescan.md).
CLOSE_BLOCKED_KEYWORD_STAGES = text(
    """
    WITH blocked AS (
        SELECT context_id FROM ai.context_ai_state
        WHERE embedding_status = 'FAILED' AND keyword_status IN ('PENDING', 'PROCESSING')
        ORDER BY context_id
        LIMIT :batch_size
        FOR UPDATE SKIP LOCKED
    )
    UPDATE ai.context_ai_state AS s
    SET keyword_status = 'FAILED', keyword_failure = :reason, updated_at = now()
    FROM blocked
    WHERE s.context_id = blocked.context_id
    RETURNING s.context_id
    """
)


@dataclass(frozen=True, slots=True)
class Expiries:
    """Seconds after which a ``PENDING`` / ``PROCESSING`` next stage is stale (§9)."""

    pending_seconds: float
    processing_seconds: float

    def as_params(self) -> dict[str, float]:
        return {
            "pending_expiry_seconds": float(self.pending_seconds),
            "processing_expiry_seconds": float(self.processing_seconds),
        }


async def insert_pending(
    conn: AsyncConnection, *, context_id: int, user_id: int, record_id: int
) -> None:
    """The new context's state row: ``PENDING``/``PENDING``/0 (§9 Create)."""
    params = {"context_id": context_id, "user_id": user_id, "record_id": record_id}
    await conn.execute(INSERT_PENDING_STATE, params)


async def cancel(conn: AsyncConnection, context_ids: Sequence[int]) -> int:
    """Both statuses ``CANCELLED`` for every row among ``context_ids``; rows changed."""
    result = await conn.execute(CANCEL_STATES, {"context_ids": list(context_ids)})
    return result.rowcount


async def claim_stale(
    conn: AsyncConnection, *, expiries: Expiries, max_retry: int, batch_size: int
) -> list[tuple[int, int]]:
    """Claim up to ``batch_size`` stale rows with ``retry_count < max_retry``.

    Returns ``(context_id, retry_count after the increment)`` pairs.
    """
    params = {"max_retry": max_retry, "batch_size": batch_size, **expiries.as_params()}
    result = await conn.execute(CLAIM_STALE, params)
    return [(int(row.context_id), int(row.retry_count)) for row in result]


async def finalize_exhausted(
    conn: AsyncConnection, *, expiries: Expiries, max_retry: int, batch_size: int
) -> list[int]:
    """Fail the unfinished stages of up to ``batch_size`` exhausted stale rows; their ids."""
    params = {
        "max_retry": max_retry,
        "batch_size": batch_size,
        "reason": FailureReason.RETRIES_EXHAUSTED.value,
        **expiries.as_params(),
    }
    return [
        int(context_id) for context_id in (await conn.execute(FINALIZE_EXHAUSTED, params)).scalars()
    ]


async def close_blocked_keyword_stages(conn: AsyncConnection, *, batch_size: int) -> list[int]:
    """Fail up to ``batch_size`` keyword stages whose embedding stage ``FAILED``; their ids."""
    params = {"batch_size": batch_size, "reason": FailureReason.EMBEDDING_FAILED.value}
    result = await conn.execute(CLOSE_BLOCKED_KEYWORD_STAGES, params)
    return [int(context_id) for context_id in result.scalars()]
