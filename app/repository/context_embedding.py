"""``ai.context_embedding``: personal search over the stored vectors (§7).

Vectors are written only by the embedding save (``stage_saves.SAVE_EMBEDDING``), whose conflict
branch never touches ``is_deleted`` (§0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One record's best context for a query; ``similarity`` is cosine, -1..1."""

    record_id: int
    context_id: int
    similarity: float


# Exact cosine over one user's live, completed vectors of one profile; the best context per
# record; the limit applied after de-duplication (§7). NaN (a zero vector) never qualifies (FC-04).
SEARCH_SIMILAR = text(
    """
    SELECT record_id, context_id, similarity FROM (
        SELECT DISTINCT ON (e.record_id) e.record_id, e.context_id,
               1 - (e.embedding <=> CAST(:query AS vector)) AS similarity
        FROM ai.context_embedding AS e
        JOIN ai.context_ai_state AS s ON s.context_id = e.context_id
        WHERE e.user_id = :user_id AND e.is_deleted = false
          AND e.embedding_profile = :profile AND s.embedding_status = 'COMPLETED'
          AND 1 - (e.embedding <=> CAST(:query AS vector)) <> 'NaN'::float8
        ORDER BY e.record_id, similarity DESC, e.context_id
    ) AS best
    ORDER BY similarity DESC, record_id
    LIMIT :limit
    """
)


async def search_similar(
    conn: AsyncConnection, *, user_id: int, query: np.ndarray, profile: str, limit: int
) -> list[SearchHit]:
    """Records of ``user_id`` closest to ``query`` (float32 ``(dimension,)``), best first."""
    result = await conn.execute(
        SEARCH_SIMILAR,
        {"user_id": user_id, "query": query, "profile": profile, "limit": limit},
    )
    return [SearchHit(row.record_id, row.context_id, float(row.similarity)) for row in result]
