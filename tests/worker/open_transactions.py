"""Transactions held open by another session and waiting on the row locks they hold: the core
side's delete (§9) committed or left open, and a call started until it queues behind a lock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncTransaction

T = TypeVar("T")


# The first statement of the core side's delete (§9): both statuses of one context CANCELLED.
CANCEL_STAGES = text(
    "UPDATE ai.context_ai_state SET embedding_status = 'CANCELLED', "
    "keyword_status = 'CANCELLED', updated_at = now() WHERE context_id = :id"
)


async def cancel_context(engine: AsyncEngine, *, context_id: int) -> None:
    """The core side's delete (§9) in the documented lock order (docs/lock-order.md): both
    statuses CANCELLED first, then is_deleted on the embedding."""
    async with engine.begin() as conn:
        await conn.execute(CANCEL_STAGES, {"id": context_id})
        await conn.execute(
            text(
                "UPDATE ai.context_embedding SET is_deleted = true, updated_at = now() "
                "WHERE context_id = :id"
            ),
            {"id": context_id},
        )


@asynccontextmanager
async def cancelled_in_open_transaction(
    engine: AsyncEngine, context_id: int
) -> AsyncIterator[AsyncTransaction]:
    """The core's delete (``CANCEL_STAGES``) in a transaction left open: the state row stays
    locked until the caller commits the transaction yielded (rolled back if not)."""
    async with engine.connect() as conn:
        transaction = await conn.begin()
        await conn.execute(CANCEL_STAGES, {"id": context_id})
        try:
            yield transaction
        finally:
            if transaction.is_active:
                await transaction.rollback()


# Sessions of this database waiting for a lock.
LOCK_WAITERS = text(
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
)
LOCK_WAIT_TIMEOUT_SECONDS = 10


async def lock_waiters_reach(engine: AsyncEngine, count: int) -> None:
    """Return once ``count`` sessions wait for a lock (``TimeoutError`` after
    ``LOCK_WAIT_TIMEOUT_SECONDS``)."""
    async with asyncio.timeout(LOCK_WAIT_TIMEOUT_SECONDS):
        while True:
            async with engine.connect() as conn:
                if (await conn.execute(LOCK_WAITERS)).scalar_one() >= count:
                    return
            await asyncio.sleep(0.01)  # polling the database for an observed state


async def finished_behind_lock(
    engine: AsyncEngine,
    call: Coroutine[Any, Any, T],
    unblock: Callable[[], Awaitable[object]],
) -> T:
    """Start ``call``, wait until it waits on a lock that another transaction holds, check it
    has not finished, then ``unblock`` (that transaction's commit or rollback); what ``call``
    returns."""
    task = asyncio.create_task(call)
    await lock_waiters_reach(engine, 1)
    assert not task.done()
    await unblock()
    return await task
