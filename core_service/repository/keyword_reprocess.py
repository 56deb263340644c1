"""The operational reset of keyword stages for a preset reclassification (§0, seed 000 §2 and
§2.1; ``pinlog-core reprocess keywords``, docs/operations.md).

A **stale judgment** is a live context (not deleted, on an active record of an active member)
whose two stages are ``COMPLETED``, whose vector is of the profile in use and not hidden, and
whose keyword judgment used an older preset list than ``:version`` (its analysis row's
``preset_version``; a completed judgment without an analysis row counts as older) or the
preset vectors of another embedding profile (its ``embedding_profile``, 0060: after a cutover
or rollback every judgment is made again under the profile now in use; NULL is a judgment
from before the column, stamped by ``reembed start``, and counts as the profile in use). The reset
sends such a keyword stage back to ``PENDING`` with a fresh budget (``retry_count = 0`` and
``dispatch_accepted_at`` cleared, so the first dispatch a worker takes is free, as for a new
context) and marks the row with ``keyword_reprocess_version = :version``: reads keep showing
the previous keywords until the save replaces them (``pinlog_platform.contract.keyword_reads``).
``keyword_via_batch`` records how the run sends it (``--via batch``: the provider's Batch API,
``core_service.repository.keyword_batches``), and no batch holds it any more.

The selection reads ``core.*`` without locking (it only proposes ids); the reset locks the
state rows alone, in ``context_id`` order (docs/lock-order.md), and its WHERE clause is the
guard: both stages still ``COMPLETED`` (so ``CANCELLED``, ``FAILED`` and a stage already sent
back are never touched: a delete, edit or withdrawal that committed first wins), the vector
still of the profile and live, no judgment at ``:version`` or later. It writes no attempt
column and nothing but the state row.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from pinlog_platform.contract.preset_list import LIST_VERSION

# Live contexts whose completed judgment is older than :version under :profile (module
# docstring), aliased s (state), c (context); the FROM and WHERE of the count and the batch.
_STALE_JUDGMENTS = """
    FROM ai.context_ai_state AS s
    JOIN core.context AS c ON c.id = s.context_id
    JOIN core.record AS r ON r.id = c.record_id
    JOIN core.member AS m ON m.id = c.member_id
    JOIN ai.context_embedding AS e ON e.context_id = s.context_id
    LEFT JOIN ai.context_keyword_analysis AS a ON a.context_id = s.context_id
    WHERE c.deleted_at IS NULL AND r.deleted_at IS NULL AND m.deleted_at IS NULL
      AND s.embedding_status = 'COMPLETED' AND s.keyword_status = 'COMPLETED'
      AND e.embedding_profile = :profile AND NOT e.is_deleted
      AND (a.preset_version IS NULL OR a.preset_version < :version
           OR a.embedding_profile <> :profile)
"""

# How many stale judgments there are now.
COUNT_STALE_JUDGMENTS = text("SELECT count(*) AS stale" + _STALE_JUDGMENTS)

# The next :limit stale judgments after context :after, in id order (a run's cursor).
SELECT_STALE_JUDGMENTS = text(
    "SELECT s.context_id"
    + _STALE_JUDGMENTS
    + "  AND s.context_id > :after\n    ORDER BY s.context_id\n    LIMIT :limit"
)

# Reset the keyword stages of :context_ids that are still stale judgments (module docstring):
# state rows locked in id order, the guard in the WHERE clauses.
RESET_KEYWORD_STAGES = text(
    """
    WITH locked AS (
        SELECT s.context_id
        FROM ai.context_ai_state AS s
        WHERE s.context_id = ANY(CAST(:context_ids AS bigint[]))
          AND s.embedding_status = 'COMPLETED' AND s.keyword_status = 'COMPLETED'
          AND EXISTS (SELECT 1 FROM ai.context_embedding AS e
                      WHERE e.context_id = s.context_id
                        AND e.embedding_profile = :profile AND NOT e.is_deleted)
          AND NOT EXISTS (SELECT 1 FROM ai.context_keyword_analysis AS a
                          WHERE a.context_id = s.context_id AND a.preset_version >= :version
                            AND coalesce(a.embedding_profile, :profile) = :profile)
        ORDER BY s.context_id
        FOR UPDATE
    )
    UPDATE ai.context_ai_state AS s
    SET keyword_status = 'PENDING',
        retry_count = 0,
        dispatch_accepted_at = NULL,
        rescanned_at = NULL,
        next_dispatch_at = NULL,
        keyword_reprocess_version = :version,
        keyword_via_batch = CAST(:via_batch AS boolean),
        keyword_batch_id = NULL,
        updated_at = now()
    FROM locked
    WHERE s.context_id = locked.context_id
      AND s.embedding_status = 'COMPLETED' AND s.keyword_status = 'COMPLETED'
    RETURNING s.context_id
    """
)


async def list_version(conn: AsyncConnection, profile: str) -> int:
    """The current preset list version of ``profile`` (``pinlog_platform.contract.preset_list``);
    0 when no preset is usable under it."""
    return int((await conn.execute(LIST_VERSION, {"profile": profile})).scalar_one())


async def count_stale(conn: AsyncConnection, *, profile: str, version: int) -> int:
    """How many live contexts have a completed judgment older than ``version``."""
    params = {"profile": profile, "version": version}
    return int((await conn.execute(COUNT_STALE_JUDGMENTS, params)).scalar_one())


async def select_stale(
    conn: AsyncConnection, *, profile: str, version: int, after: int, limit: int
) -> list[int]:
    """Up to ``limit`` context ids of stale judgments above ``after``, ascending."""
    params = {"profile": profile, "version": version, "after": after, "limit": limit}
    result = await conn.execute(SELECT_STALE_JUDGMENTS, params)
    return [int(context_id) for context_id in result.scalars()]


async def reset_keyword_stages(
    conn: AsyncConnection,
    context_ids: Sequence[int],
    *,
    profile: str,
    version: int,
    via_batch: bool = False,
) -> list[int]:
    """Send the keyword stages of those ``context_ids`` that are still stale judgments back to
    ``PENDING`` for list ``version``, marked for the provider's Batch API when ``via_batch``
    (``reprocess keywords --via batch``; unmarked otherwise: a later synchronous run sends them
    the synchronous way); the ids reset, ascending."""
    params = {
        "context_ids": sorted(context_ids),
        "profile": profile,
        "version": version,
        "via_batch": via_batch,
    }
    result = await conn.execute(RESET_KEYWORD_STAGES, params)
    return sorted(int(context_id) for context_id in result.scalars())
