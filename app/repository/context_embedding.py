"""``ai.context_embedding``: one vector per context (§1, §3.2).

The worker never writes ``is_deleted`` (§0): the UPSERT's conflict branch leaves it alone, so a
cancellation the core side made is never undone by a late result.
"""

from __future__ import annotations

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
