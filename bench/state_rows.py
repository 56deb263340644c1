"""What the benchmark writes and reads in place of the core service, so that it measures the
worker alone: ``PENDING`` state rows committed before the POST (§9 Create), then the keyword
stage's status. Context ids come from the core's own sequence, so they never collide with
contexts the core service creates later in the same database."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

# Reserve n context ids from core.context's identity sequence.
RESERVE_CONTEXT_IDS = text(
    "SELECT nextval(pg_get_serial_sequence('core.context', 'id')) AS id FROM generate_series(1, :n)"
)

# Create: both statuses PENDING, retry_count 0, committed before the worker is asked.
INSERT_PENDING_STATE = text(
    "INSERT INTO ai.context_ai_state (context_id, embedding_status, keyword_status, "
    "retry_count, updated_at) VALUES (:context_id, 'PENDING', 'PENDING', 0, now())"
)

# The keyword stage's status of each given context.
KEYWORD_STATUSES = text(
    "SELECT context_id, keyword_status FROM ai.context_ai_state "
    "WHERE context_id = ANY(CAST(:ids AS bigint[]))"
)


async def reserve_context_ids(engine: AsyncEngine, n: int) -> list[int]:
    async with engine.begin() as conn:
        return [int(row.id) for row in await conn.execute(RESERVE_CONTEXT_IDS, {"n": n})]


async def create_pending_state(engine: AsyncEngine, context_id: int) -> None:
    async with engine.begin() as conn:
        await conn.execute(INSERT_PENDING_STATE, {"context_id": context_id})


async def keyword_statuses(engine: AsyncEngine, context_ids: list[int]) -> dict[int, str]:
    async with engine.connect() as conn:
        rows = await conn.execute(KEYWORD_STATUSES, {"ids": context_ids})
        return {int(row.context_id): row.keyword_status for row in rows}
