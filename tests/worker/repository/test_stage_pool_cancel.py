"""Stage statements cancelled while they wait on a row lock (§6, FC-02).

The stage deadline and shutdown cancel a task wherever it is, including inside
``StagePool.fetch_row`` while the server waits on a ``FOR UPDATE`` another transaction holds.
The connection must come back to the pool usable: no statement still running on it, no
transaction left open (transaction pooling runs each statement in an explicit one), no lock
held, and the cancelled statement's write not applied.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from app.repository import context_ai_state, stage_saves
from app.repository.stage_pool import StagePool
from pinlog_platform.contract.states import Stage
from tests.ops.pgbouncer import find_binary, running_pgbouncer
from tests.worker.support import count_rows, fetch_state, make_state, vector

EXPIRY = 600
PROFILE = "test-profile"
LOCK_STATE_ROW = text("SELECT 1 FROM ai.context_ai_state WHERE context_id = :id FOR UPDATE")
LOCK_WAITERS = text(
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
)
# Sessions other than the test's own engine connections that are inside a transaction, and
# row-level or relation locks on the state table held by anyone.
OPEN_TRANSACTIONS = text(
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
    "AND pid <> pg_backend_pid() AND state LIKE 'idle in transaction%'"
)
STATE_TABLE_LOCKS = text(
    "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
    "WHERE l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND c.relname = 'context_ai_state' AND l.pid <> pg_backend_pid()"
)


async def _admin(engine, statement) -> int:
    async with engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        return (await conn.execute(statement)).scalar_one()


async def _wait_for_lock_waiter(engine) -> None:
    deadline = time.monotonic() + 10.0
    while await _admin(engine, LOCK_WAITERS) == 0:
        assert time.monotonic() < deadline, "the statement never waited on the row lock"
        await asyncio.sleep(0.02)


def _claim(pool: StagePool, context_id: int):
    return context_ai_state.claim(pool, Stage.EMBEDDING, context_id, expiry_seconds=EXPIRY)


def _save(pool: StagePool, context_id: int, attempt: int):
    return stage_saves.save_embedding(
        pool,
        context_id=context_id,
        attempt=attempt,
        user_id=1,
        record_id=1,
        embedding=vector(context_id),
        embedding_profile=PROFILE,
    )


@pytest.fixture(scope="module")
def bouncer_url(migrated_database):
    binary = find_binary()
    if binary is None:
        pytest.skip("pgbouncer is not installed")
    workdir = Path(tempfile.mkdtemp(prefix="pinlog-pgbouncer-"))
    workdir.chmod(0o755)
    try:
        with running_pgbouncer(binary, migrated_database, workdir / "pgb") as url:
            yield url
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(params=["direct", "direct-transaction-pooling", "pgbouncer"])
async def one_connection_pool(request, migrated_database):
    """A stage pool of ONE connection, so every statement after the cancelled one reuses it."""
    if request.param == "pgbouncer":
        url = request.getfixturevalue("bouncer_url")
    else:
        url = migrated_database
    pool = await StagePool.open(url, size=1, transaction_pooling=request.param != "direct")
    yield pool
    await pool.close()


@pytest.mark.parametrize("cancels", [1, 2])
async def test_a_cancelled_save_waiting_on_a_row_lock_leaves_the_pool_usable(
    engine, one_connection_pool, cancels
):
    pool = one_connection_pool
    for context_id in (1, 2, 3):
        await make_state(engine, context_id=context_id)
    first = await _claim(pool, 1)
    assert first.claimed
    async with engine.connect() as blocker:
        transaction = await blocker.begin()
        await blocker.execute(LOCK_STATE_ROW, {"id": 1})
        save = asyncio.create_task(_save(pool, 1, first.attempt))
        await _wait_for_lock_waiter(engine)
        for _ in range(cancels):
            save.cancel()
            await asyncio.sleep(0)
        with pytest.raises(asyncio.CancelledError):
            await save
        await transaction.rollback()

    for context_id in (2, 3):
        claim = await _claim(pool, context_id)
        assert claim.claimed
        assert await _save(pool, context_id, claim.attempt) is not None
        assert await fetch_state(engine, context_id) == ("COMPLETED", "PROCESSING")
    # All or nothing. A second cancel no longer waits for the server to confirm the first
    # one: the statement may then go on and commit once the lock is released (as a save whose
    # answer is lost does; the attempt fences it), so either outcome is allowed, never half.
    applied = await count_rows(engine, "ai.context_embedding", 1)
    expected = ("COMPLETED", "PROCESSING") if applied else ("PROCESSING", "PENDING")
    assert await fetch_state(engine, 1) == expected
    if cancels == 1:
        assert not applied, "a single cancel waits until the server cancelled the statement"
    assert await _admin(engine, OPEN_TRANSACTIONS) == 0
    assert await _admin(engine, STATE_TABLE_LOCKS) == 0
    if not applied:  # the owner can still save: nothing holds the row
        assert await _save(pool, 1, first.attempt) is not None


async def test_a_cancelled_claim_waiting_on_a_row_lock_claims_nothing(engine, one_connection_pool):
    pool = one_connection_pool
    await make_state(engine, context_id=1)
    await make_state(engine, context_id=2)
    async with engine.connect() as blocker:
        transaction = await blocker.begin()
        await blocker.execute(LOCK_STATE_ROW, {"id": 1})
        claim = asyncio.create_task(_claim(pool, 1))
        await _wait_for_lock_waiter(engine)
        claim.cancel()
        with pytest.raises(asyncio.CancelledError):
            await claim
        await transaction.rollback()

    assert (await _claim(pool, 2)).claimed
    assert await fetch_state(engine, 1) == ("PENDING", "PENDING")
    assert await _admin(engine, OPEN_TRANSACTIONS) == 0
    assert await _admin(engine, STATE_TABLE_LOCKS) == 0
    assert (await _claim(pool, 1)).claimed


TERMINATE_LOCK_WAITERS = text(
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"
)


async def test_a_backend_terminated_during_the_lock_wait_is_retried_on_a_fresh_connection(
    engine, one_connection_pool
):
    # 57P01 (terminated) changed nothing: the claim runs once more on a new connection and
    # costs no stage (§6); the terminated connection never serves again.
    pool = one_connection_pool
    await make_state(engine, context_id=1)
    await make_state(engine, context_id=2)
    async with engine.connect() as blocker:
        transaction = await blocker.begin()
        await blocker.execute(LOCK_STATE_ROW, {"id": 1})
        claim = asyncio.create_task(_claim(pool, 1))
        await _wait_for_lock_waiter(engine)
        assert await _admin(engine, TERMINATE_LOCK_WAITERS) == 1
        await _wait_for_lock_waiter(engine)  # the retry, on its new connection
        await transaction.rollback()
    assert (await claim).claimed
    assert await fetch_state(engine, 1) == ("PROCESSING", "PENDING")
    assert (await _claim(pool, 2)).claimed
    assert await _admin(engine, OPEN_TRANSACTIONS) == 0
