"""Read-only facts about core and ai rows, for assertions in core-service tests."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine


@dataclass(frozen=True)
class StateRow:
    embedding_status: str
    keyword_status: str
    retry_count: int
    updated_at: datetime
    rescanned_at: datetime | None
    user_id: int | None
    record_id: int | None

    @property
    def statuses(self) -> tuple[str, str]:
        return self.embedding_status, self.keyword_status


@dataclass(frozen=True)
class ContextRow:
    record_id: int
    member_id: int
    body: str
    origin_created_at: datetime
    created_at: datetime
    deleted: bool


async def state(engine: AsyncEngine, context_id: int) -> StateRow | None:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT embedding_status, keyword_status, retry_count, updated_at, "
                    "rescanned_at, user_id, record_id FROM ai.context_ai_state "
                    "WHERE context_id = :id"
                ),
                {"id": context_id},
            )
        ).one_or_none()
    return None if row is None else StateRow(*row)


async def context(engine: AsyncEngine, context_id: int) -> ContextRow | None:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT record_id, member_id, body, origin_created_at, created_at, "
                    "deleted_at IS NOT NULL FROM core.context WHERE id = :id"
                ),
                {"id": context_id},
            )
        ).one_or_none()
    return None if row is None else ContextRow(*row)


async def embedding_deleted(engine: AsyncEngine, context_id: int) -> bool | None:
    """``is_deleted`` of the context's vector; ``None`` when there is none."""
    async with engine.connect() as conn:
        return (
            await conn.execute(
                text("SELECT is_deleted FROM ai.context_embedding WHERE context_id = :id"),
                {"id": context_id},
            )
        ).scalar_one_or_none()


async def count(engine: AsyncEngine, sql: str, **params: object) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(text(sql), params)).scalar_one())


async def invariant_violations(engine: AsyncEngine) -> dict[str, int]:
    """Counts of states the lifecycle must never leave behind (all zero when sound)."""
    checks = {
        "live_context_under_deleted_record": (
            "SELECT count(*) FROM core.context c JOIN core.record r ON r.id = c.record_id "
            "WHERE c.deleted_at IS NULL AND r.deleted_at IS NOT NULL"
        ),
        "deleted_context_not_cancelled": (
            "SELECT count(*) FROM core.context c JOIN ai.context_ai_state s "
            "ON s.context_id = c.id WHERE c.deleted_at IS NOT NULL "
            "AND (s.embedding_status <> 'CANCELLED' OR s.keyword_status <> 'CANCELLED')"
        ),
        "live_vector_under_cancelled_state": (
            "SELECT count(*) FROM ai.context_embedding e JOIN ai.context_ai_state s "
            "ON s.context_id = e.context_id WHERE e.is_deleted = false "
            "AND s.embedding_status = 'CANCELLED'"
        ),
        "active_record_without_active_context": (
            "SELECT count(*) FROM core.record r WHERE r.deleted_at IS NULL AND NOT EXISTS "
            "(SELECT 1 FROM core.context c WHERE c.record_id = r.id AND c.deleted_at IS NULL)"
        ),
        "two_active_records_for_one_place": (
            "SELECT count(*) FROM (SELECT member_id, place_id FROM core.record "
            "WHERE deleted_at IS NULL GROUP BY 1, 2 HAVING count(*) > 1) AS d"
        ),
        "retry_count_above_three": "SELECT count(*) FROM ai.context_ai_state WHERE retry_count > 3",
    }
    return {name: await count(engine, sql) for name, sql in checks.items()}


async def backdate(engine: AsyncEngine, context_id: int, seconds: float) -> None:
    """Move ``updated_at`` and ``rescanned_at`` into the past, as time passing would."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE ai.context_ai_state SET "
                "updated_at = updated_at - make_interval(secs => :s), "
                "rescanned_at = rescanned_at - make_interval(secs => :s) "
                "WHERE context_id = :id"
            ),
            {"id": context_id, "s": float(seconds)},
        )
