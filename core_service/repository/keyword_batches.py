"""The keyword stages a ``reprocess keywords --via batch`` marked for the provider's Batch API
(``ai.context_ai_state.keyword_via_batch`` and ``keyword_batch_id``, 0120; docs/operations.md
"Reprocess via the Batch API"; docs/contract.md §2 and §9, Deviation "batch-held work").

The reset marks them (``keyword_reprocess.RESET_KEYWORD_STAGES``); the backfill loop of every
core process proposes the marked stages no batch holds (``PROPOSE_KEYWORD_BATCH``: ``SKIP
LOCKED``, stamped ``rescanned_at`` so two processes never send one at once and a stage is sent
again only after the resend delay) and sends them to a worker, which holds them in a provider
batch. The rescan and the finalizer leave every marked open stage alone
(``context_ai_state``): it is the batch path's until a batch returns it (the worker clears
the mark). A stage that cannot fit in a request a worker takes goes back to the synchronous
path (``RETURN_TO_SYNC``). None of these moves a status.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from core_service.repository.embedding_switch import BackfillSource

# The marked keyword stages no batch holds and nobody sent within :resend_seconds: PENDING,
# or PROCESSING past :expiry_seconds (a submission that never recorded its batch), of live
# contexts; up to :limit in id order, skipping rows locked elsewhere, stamped as sent. What a
# worker needs to claim and judge them.
PROPOSE_KEYWORD_BATCH = text(
    """
    WITH picked AS (
        SELECT s.context_id
        FROM ai.context_ai_state AS s
        JOIN core.context AS c ON c.id = s.context_id
        WHERE s.keyword_via_batch AND s.keyword_batch_id IS NULL
          AND s.embedding_status = 'COMPLETED'
          AND (s.keyword_status = 'PENDING'
               OR (s.keyword_status = 'PROCESSING'
                   AND s.updated_at < now() - make_interval(secs => :expiry_seconds)))
          AND (s.rescanned_at IS NULL
               OR s.rescanned_at < now() - make_interval(secs => :resend_seconds))
          AND c.deleted_at IS NULL
        ORDER BY s.context_id
        LIMIT :limit
        FOR UPDATE OF s SKIP LOCKED
    ), sent AS (
        UPDATE ai.context_ai_state AS s
        SET rescanned_at = now()
        FROM picked AS p
        WHERE s.context_id = p.context_id
        RETURNING s.context_id
    )
    SELECT c.id AS context_id, c.member_id, c.record_id, c.body
    FROM sent AS k
    JOIN core.context AS c ON c.id = k.context_id
    ORDER BY c.id
    """
)

# Marked stages of a request no worker took: sendable again at once.
UNMARK_SENT = text(
    """
    UPDATE ai.context_ai_state
    SET rescanned_at = NULL
    WHERE context_id = ANY(CAST(:context_ids AS bigint[])) AND keyword_via_batch
      AND keyword_batch_id IS NULL
    """
)

# Marked stages that cannot go by batch (too large for a request alone): the synchronous path.
RETURN_TO_SYNC = text(
    """
    UPDATE ai.context_ai_state
    SET keyword_via_batch = false
    WHERE context_id = ANY(CAST(:context_ids AS bigint[])) AND keyword_via_batch
      AND keyword_batch_id IS NULL
    """
)

# How many marked keyword stages are still open (to send, or held by a batch).
OPEN_VIA_BATCH = text(
    """
    SELECT count(*) FROM ai.context_ai_state
    WHERE keyword_via_batch AND keyword_status IN ('PENDING', 'PROCESSING')
    """
)


async def propose(
    conn: AsyncConnection, *, limit: int, resend_seconds: float, expiry_seconds: float
) -> list[BackfillSource]:
    """The next marked stages to send by batch (``PROPOSE_KEYWORD_BATCH``), stamped sent."""
    params = {
        "limit": limit,
        "resend_seconds": float(resend_seconds),
        "expiry_seconds": float(expiry_seconds),
    }
    result = await conn.execute(PROPOSE_KEYWORD_BATCH, params)
    return [BackfillSource(r.context_id, r.member_id, r.record_id, r.body) for r in result]


async def unmark(conn: AsyncConnection, context_ids: Sequence[int]) -> int:
    """Make these stages sendable again at once (``UNMARK_SENT``); rows changed."""
    return (await conn.execute(UNMARK_SENT, {"context_ids": list(context_ids)})).rowcount


async def return_to_sync(conn: AsyncConnection, context_ids: Sequence[int]) -> int:
    """Send these marked stages the synchronous way (``RETURN_TO_SYNC``); rows changed."""
    return (await conn.execute(RETURN_TO_SYNC, {"context_ids": list(context_ids)})).rowcount


async def open_via_batch(conn: AsyncConnection) -> int:
    """How many marked keyword stages are open (``OPEN_VIA_BATCH``)."""
    return int((await conn.execute(OPEN_VIA_BATCH)).scalar_one())
