"""``ai.context_embedding``: one vector per context (§1, §3.2).

The worker never writes ``is_deleted`` (§0): the UPSERT's conflict branch leaves it alone, so a
cancellation the core side made is never undone by a late result.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

# Insert or replace this context's vector; is_deleted is deliberately not in the SET list.
UPSERT_EMBEDDING = text(
    """
    INSERT INTO ai.context_embedding
        (context_id, user_id, record_id, embedding, embedding_profile, updated_at)
    VALUES (:context_id, :user_id, :record_id, :embedding, :embedding_profile, now())
    ON CONFLICT (context_id) DO UPDATE SET
        user_id = EXCLUDED.user_id,
        record_id = EXCLUDED.record_id,
        embedding = EXCLUDED.embedding,
        embedding_profile = EXCLUDED.embedding_profile,
        updated_at = now()
    """
)


async def upsert(
    conn: AsyncConnection,
    *,
    context_id: int,
    user_id: int,
    record_id: int,
    embedding: np.ndarray,
    embedding_profile: str,
) -> None:
    """Store ``embedding`` (float32, shape ``(dimension,)``) under ``embedding_profile``."""
    await conn.execute(
        UPSERT_EMBEDDING,
        {
            "context_id": context_id,
            "user_id": user_id,
            "record_id": record_id,
            "embedding": embedding,
            "embedding_profile": embedding_profile,
        },
    )


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
