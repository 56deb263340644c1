"""What the end-to-end tests assert on: rows of the shared database and Prometheus counters of
the running services, plus bounded polling for a condition (never a bare sleep)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.core.support import count

POLL_SECONDS = 0.1
UNFINISHED = ("PENDING", "PROCESSING")


@dataclass(frozen=True, slots=True)
class StateRow:
    embedding: str
    keyword: str
    retry_count: int


async def state(engine: AsyncEngine, context_id: int) -> StateRow:
    """The ``ai.context_ai_state`` row of one context (it must exist)."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT embedding_status, keyword_status, retry_count "
                    "FROM ai.context_ai_state WHERE context_id = :id"
                ),
                {"id": context_id},
            )
        ).one()
    return StateRow(row.embedding_status, row.keyword_status, row.retry_count)


async def context_deleted(engine: AsyncEngine, context_id: int) -> bool:
    """Whether ``core.context`` marks the context soft-deleted (it must exist)."""
    async with engine.connect() as conn:
        return (
            await conn.execute(
                text("SELECT deleted_at IS NOT NULL FROM core.context WHERE id = :id"),
                {"id": context_id},
            )
        ).scalar_one()


async def active_context_ids(engine: AsyncEngine, record_id: int) -> list[int]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT id FROM core.context WHERE record_id = :id AND deleted_at IS NULL "
                "ORDER BY id"
            ),
            {"id": record_id},
        )
        return [row.id for row in rows]


async def keyword_ids(engine: AsyncEngine, context_id: int) -> set[int]:
    """Keyword rows stored for the context, whatever its state (§9: they may remain)."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT keyword_id FROM ai.context_keyword WHERE context_id = :id"),
            {"id": context_id},
        )
        return {row.keyword_id for row in rows}


async def wait_until(
    condition: Callable[[], Awaitable[bool]], *, within: float = 20, what: str = "condition"
) -> None:
    """Poll ``condition`` every 0.1 s until it holds; fail after ``within`` seconds."""
    try:
        async with asyncio.timeout(within):
            # Polls another process's effects (database rows, counters): nothing to await.
            while not await condition():  # noqa: ASYNC110
                await asyncio.sleep(POLL_SECONDS)
    except TimeoutError:
        raise AssertionError(f"timed out after {within:g} s waiting for {what}") from None


async def wait_finished(engine: AsyncEngine, context_ids: Sequence[int], within=20.0) -> None:
    """Until no stage of the contexts is ``PENDING`` or ``PROCESSING``."""

    async def finished() -> bool:
        states = [await state(engine, context_id) for context_id in context_ids]
        return not any(s.embedding in UNFINISHED or s.keyword in UNFINISHED for s in states)

    await wait_until(finished, within=within, what=f"contexts {list(context_ids)} to finish")


async def wait_stale(engine: AsyncEngine, context_id: int, seconds: float) -> None:
    """Until the row has been untouched by the worker and the rescan for ``seconds`` seconds,
    by the database clock (the measure of §9 and of the rescan's ``rescanned_at``)."""
    sql = (
        "SELECT count(*) FROM ai.context_ai_state WHERE context_id = :id AND "
        "greatest(updated_at, coalesce(rescanned_at, updated_at)) "
        "< now() - make_interval(secs => :seconds)"
    )

    async def stale() -> bool:
        return await count(engine, sql, id=context_id, seconds=float(seconds)) == 1

    await wait_until(stale, within=seconds + 10, what=f"context {context_id} to be stale")


async def metric(base_url: str, name: str, **labels: str) -> float:
    """A counter sample of a running service's ``GET /metrics`` (0 when never counted)."""
    async with httpx.AsyncClient(base_url=base_url, timeout=5) as client:
        body = (await client.get("/metrics")).text
    total = 0.0
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total
