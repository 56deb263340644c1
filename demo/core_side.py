"""What the core side does for the demo (§9 Create), and the read-back for the table.

The worker never creates state rows; this module plays the core service that does.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

# Next free context id: demo runs against a kept database never reuse an id.
NEXT_CONTEXT_ID = text("SELECT coalesce(max(context_id), 0) + 1 FROM ai.context_ai_state")

# Create: both statuses PENDING, retry_count 0, committed before the worker is asked.
INSERT_PENDING_STATE = text(
    "INSERT INTO ai.context_ai_state (context_id, embedding_status, keyword_status, "
    "retry_count, updated_at) VALUES (:context_id, 'PENDING', 'PENDING', 0, now())"
)

# Unfinished stages among the given contexts.
COUNT_UNFINISHED = text(
    "SELECT count(*) FROM ai.context_ai_state WHERE context_id = ANY(CAST(:ids AS bigint[])) "
    "AND (embedding_status IN ('PENDING', 'PROCESSING') "
    "OR keyword_status IN ('PENDING', 'PROCESSING'))"
)

# Statuses and chosen keywords (display names, best first) as the owner would read them.
LOAD_RESULTS = text(
    """
    SELECT s.context_id, s.embedding_status, s.keyword_status,
           coalesce(array_agg(p.display_name ORDER BY k.confidence DESC, p.id)
                    FILTER (WHERE p.id IS NOT NULL), '{}') AS keywords
    FROM ai.context_ai_state AS s
    LEFT JOIN ai.context_keyword AS k ON k.context_id = s.context_id
        AND s.keyword_status = 'COMPLETED'
    LEFT JOIN ai.keyword_preset AS p ON p.id = k.keyword_id
        AND p.is_active AND p.visibility IN ('PUBLIC', 'PRIVATE_ONLY')
    WHERE s.context_id = ANY(CAST(:ids AS bigint[]))
    GROUP BY s.context_id, s.embedding_status, s.keyword_status
    ORDER BY s.context_id
    """
)


@dataclass(frozen=True, slots=True)
class ContextResult:
    context_id: int
    embedding_status: str
    keyword_status: str
    keywords: tuple[str, ...]


async def next_context_id(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(NEXT_CONTEXT_ID)).scalar_one())


async def create_pending_state(engine: AsyncEngine, context_id: int) -> None:
    async with engine.begin() as conn:
        await conn.execute(INSERT_PENDING_STATE, {"context_id": context_id})


async def count_unfinished(engine: AsyncEngine, context_ids: list[int]) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(COUNT_UNFINISHED, {"ids": context_ids})).scalar_one())


async def load_results(engine: AsyncEngine, context_ids: list[int]) -> list[ContextResult]:
    async with engine.connect() as conn:
        rows = await conn.execute(LOAD_RESULTS, {"ids": context_ids})
        return [
            ContextResult(r.context_id, r.embedding_status, r.keyword_status, tuple(r.keywords))
            for r in rows
        ]
