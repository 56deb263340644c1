"""Database faults under a running worker (CONTRACT §3, §6, FC-01, FC-03).

Connection loss and lock waits are transient (§6): the stage stays recoverable, nothing is
half-stored, and the worker keeps serving other contexts.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sqlalchemy import text

from tests.worker.harness import running_worker, worker_settings
from tests.worker.support import (
    app_records,
    count_rows,
    fetch_state,
    make_state,
    release,
    start_held,
)

NOTE = "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음."
OTHER_NOTE = "친구들이랑 수다 떨기 좋은 넓은 술집. 단체석 있음."

TERMINATE_OTHERS = text(
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
    "AND backend_type = 'client backend'"
)
TERMINATE_LOCK_WAITERS = text(
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"
)
LOCK_WAITERS = text(
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
)
OLDER_CLIENT_SESSIONS = text(
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE datname = current_database() AND backend_type = 'client backend' "
    "AND backend_start < (SELECT backend_start FROM pg_stat_activity "
    "WHERE pid = pg_backend_pid())"
)
LOCK_STATE_ROW = text("SELECT 1 FROM ai.context_ai_state WHERE context_id = :id FOR UPDATE")


async def _admin(engine, statement) -> int:
    async with engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        return (await conn.execute(statement)).scalar_one()


async def _wait_until_terminated_sessions_are_gone(engine) -> None:
    # pg_terminate_backend only signals: wait until no client session older than this one is
    # left, so every closed socket has reached the worker's event loop too.
    deadline = time.monotonic() + 10.0
    while await _admin(engine, OLDER_CLIENT_SESSIONS) > 0:
        assert time.monotonic() < deadline, "terminated sessions never went away"
        await asyncio.sleep(0.02)


async def _wait_for_lock_waiter(engine) -> None:
    deadline = time.monotonic() + 10.0
    while await _admin(engine, LOCK_WAITERS) == 0:
        assert time.monotonic() < deadline, "the worker never waited on the row lock"
        await asyncio.sleep(0.02)


async def test_every_worker_connection_killed_during_the_provider_call_costs_nothing(
    engine, worker, fake_openai, hold, caplog
):
    """FC-03, §6: no connection is held across a provider call, so terminating every session
    while the embedding call is in flight touches no work in progress; the stage pool notices
    that the server closed its idle connections and opens new ones, so the save that follows
    succeeds (no ping, no transient error) and so does the next context."""
    await make_state(engine, context_id=1)
    await make_state(engine, context_id=2)
    await worker.process(99, NOTE)  # warm the worker's pool (no state row: a no-op)
    held = hold()
    task = await start_held(worker, fake_openai.script_embeddings, held, 1, NOTE)

    killed = await _admin(engine, TERMINATE_OTHERS)
    await _wait_until_terminated_sessions_are_gone(engine)
    release(held)
    with caplog.at_level(logging.WARNING):
        await task

    assert killed >= 1
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert app_records(caplog, logging.WARNING) == []
    await worker.process(2, NOTE)
    assert await fetch_state(engine, 2) == ("COMPLETED", "COMPLETED")


async def test_connection_killed_while_the_save_waits_on_a_row_lock_costs_no_stage(
    engine, worker, fake_openai, hold, caplog
):
    """§6: a backend terminated while the save waits on ``FOR UPDATE`` (57P01) changed
    nothing: the save runs once more on a fresh connection and the context completes, with no
    warning; the worker serves the next context normally."""
    await make_state(engine, context_id=1)
    await make_state(engine, context_id=2)
    held = hold()
    task = await start_held(worker, fake_openai.script_embeddings, held, 1, NOTE)
    async with engine.connect() as blocker:
        transaction = await blocker.begin()
        await blocker.execute(LOCK_STATE_ROW, {"id": 1})
        release(held)
        await _wait_for_lock_waiter(engine)
        assert await _admin(engine, TERMINATE_LOCK_WAITERS) == 1
        await transaction.rollback()  # the keyword claim that follows locks the row too
    with caplog.at_level(logging.WARNING):
        await asyncio.wait_for(task, 10)

    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert await count_rows(engine, "ai.context_embedding", 1) == 1
    assert app_records(caplog, logging.WARNING) == []

    await worker.process(2, OTHER_NOTE)
    assert await fetch_state(engine, 2) == ("COMPLETED", "COMPLETED")


async def test_a_row_lock_held_elsewhere_does_not_stall_the_worker_forever(
    engine, migrated_database, fake_openai, presets, caplog
):
    """§6: a lock wait is bounded ("lock timeout" is transient). While another session holds
    the state row of context 1, a single worker task still completes context 2 queued behind it.
    The WARNING names a lock timeout, not "database unavailable" (the database is up).
    """
    await make_state(engine, context_id=1)
    await make_state(engine, context_id=2)
    settings = worker_settings(migrated_database, fake_openai, worker_concurrency=1)
    async with running_worker(settings) as worker, engine.connect() as blocker:
        transaction = await blocker.begin()
        await blocker.execute(LOCK_STATE_ROW, {"id": 1})
        try:
            for context_id, note in ((1, NOTE), (2, OTHER_NOTE)):
                body = {"contextId": context_id, "userId": 1, "recordId": 1, "text": note}
                assert (await worker.post(body)).status_code == 202
            deadline = time.monotonic() + 4.0
            while await fetch_state(engine, 2) != ("COMPLETED", "COMPLETED"):
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            second = await fetch_state(engine, 2)
        finally:
            await transaction.rollback()
        await worker.drain()

    assert second == ("COMPLETED", "COMPLETED"), "context 2 starved behind a locked row"
    assert await fetch_state(engine, 1) == ("PENDING", "PENDING")
    warnings = [r.getMessage() for r in app_records(caplog, logging.WARNING)]
    (lock_warning,) = [m for m in warnings if "context_id=1" in m]
    assert "reason=database lock timeout" in lock_warning
    assert "cause=DatabaseLockTimeout" in lock_warning
    assert not any("database unavailable" in m for m in warnings)
