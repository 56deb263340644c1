"""``ai.context_embedding.is_deleted``, which only the core service writes (§0, §9 Delete)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

# Hide the vectors of cancelled contexts from search; rows locked in id order, after the state
# rows (docs/lock-order.md). Zero rows is normal: no embedding was stored yet.
MARK_EMBEDDINGS_DELETED = text(
    """
    WITH locked AS (
        SELECT context_id FROM ai.context_embedding
        WHERE context_id = ANY(CAST(:context_ids AS bigint[]))
        ORDER BY context_id
        FOR UPDATE
    )
    UPDATE ai.context_embedding AS e
    SET is_deleted = true, updated_at = now()
    FROM locked
    WHERE e.context_id = locked.context_id
    """
)


async def mark_deleted(conn: AsyncConnection, context_ids: Sequence[int]) -> int:
    """``is_deleted = true`` on the vectors of ``context_ids``; rows changed (0 is fine)."""
    result = await conn.execute(MARK_EMBEDDINGS_DELETED, {"context_ids": list(context_ids)})
    return result.rowcount
