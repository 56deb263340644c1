"""The stage pool when the database fails the ways production databases do (§6): a silent
peer (a TCP proxy that stops forwarding, every socket open) ends a statement at the command
deadline as a transient error; a read-only server (failover, ``default_transaction_read_only``)
is transient and its sessions are discarded; a session that died while pooled costs no
statement. Real PostgreSQL, a real proxy."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from app.errors import DatabaseUnavailable
from app.repository import context_ai_state
from app.repository.named_statements import compile_named
from app.repository.stage_pool import StagePool
from pinlog_platform.contract.states import Stage
from tests.fault_proxy import fault_proxy, set_read_only
from tests.worker.support import fetch_state, make_state

SELECT_ONE = compile_named("SELECT 1")
COMMAND_TIMEOUT = 0.5
EXPIRY = 600


def _claim(pool: StagePool, context_id: int):
    return context_ai_state.claim(pool, Stage.EMBEDDING, context_id, expiry_seconds=EXPIRY)


async def test_a_silent_database_ends_a_stage_statement_at_the_command_deadline(
    migrated_database, engine
):
    await make_state(engine, context_id=1)
    async with fault_proxy(migrated_database) as proxy:
        pool = await StagePool.open(proxy.url, size=2, command_timeout_seconds=COMMAND_TIMEOUT)
        try:
            assert await pool.fetch_row(SELECT_ONE) == (1,)
            proxy.freeze()
            started = time.monotonic()
            with pytest.raises(DatabaseUnavailable):
                await _claim(pool, 1)
            assert time.monotonic() - started < COMMAND_TIMEOUT + 1.0
            proxy.thaw()
            assert await fetch_state(engine, 1) == ("PENDING", "PENDING")
            assert (await _claim(pool, 1)).claimed
        finally:
            await pool.close()


async def test_a_cut_connection_costs_no_statement(migrated_database):
    async with fault_proxy(migrated_database) as proxy:
        pool = await StagePool.open(proxy.url, size=1, command_timeout_seconds=COMMAND_TIMEOUT)
        try:
            assert await pool.fetch_row(SELECT_ONE) == (1,)
            proxy.cut()
            proxy.thaw()  # new connections pass again; the pooled one is gone
            assert await pool.fetch_row(SELECT_ONE) == (1,)
        finally:
            await pool.close()


async def test_a_read_only_server_is_transient_and_its_sessions_are_replaced(
    migrated_database, engine
):
    await make_state(engine, context_id=1)
    pool = await StagePool.open(migrated_database, size=2)
    try:
        assert await pool.fetch_row(SELECT_ONE) == (1,)  # a pooled session, soon read-only
        await set_read_only(engine, read_only=True)
        # A failover: every session ends, the new ones land on a read-only server.
        await _admin(engine, TERMINATE_OTHERS)
        try:
            with pytest.raises(DatabaseUnavailable):
                await _claim(pool, 1)
        finally:
            await set_read_only(engine, read_only=False)
        # The read-only sessions were discarded: the next claim runs on a writable one.
        assert (await _claim(pool, 1)).claimed
    finally:
        await pool.close()


TERMINATE_OTHERS = (
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
    "AND backend_type = 'client backend'"
)


async def _admin(engine, sql: str) -> None:
    async with engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(text(sql))


async def test_a_multi_host_url_with_target_session_attrs_finds_the_writable_server(
    migrated_database,
):
    # libpq semantics, which asyncpg follows: the first host is down, the second answers and
    # accepts writes. The stage pool and the SQLAlchemy engines take the same URL.
    from app.repository.db import create_engine

    async with fault_proxy(migrated_database) as proxy:
        url = make_url(proxy.url)
        multi_host = url.set(
            host=None,
            port=None,
            query={
                "host": ("127.0.0.1:9", f"127.0.0.1:{proxy.port}"),
                "target_session_attrs": "read-write",
            },
        ).render_as_string(False)
        pool = await StagePool.open(multi_host, size=1)
        engine = create_engine(multi_host, pool_size=1, with_vector_codec=False)
        try:
            assert await pool.fetch_row(SELECT_ONE) == (1,)
            async with engine.connect() as conn:
                assert (await conn.execute(text("SELECT 1"))).scalar() == 1
        finally:
            await pool.close()
            await engine.dispose()


async def test_no_host_accepting_the_session_asked_for_is_transient_on_every_pool(
    migrated_database,
):
    """Every host answers but none with the session asked for (mid-switchover: each server
    read-only; here a primary asked for ``standby``): the stage pool raises the transient
    ``DatabaseUnavailable`` (never a statement error that would fail a note), and an engine's
    error is transient and refused before running (docs/deployment.md "Failover")."""
    from app.repository.db import create_engine
    from pinlog_platform.db.sqlstates import is_transient, refused_before_running

    url = (
        make_url(migrated_database)
        .update_query_dict({"target_session_attrs": "standby"})
        .render_as_string(False)
    )
    pool = await StagePool.open(url, size=1)
    engine = create_engine(url, pool_size=1, with_vector_codec=False)
    try:
        with pytest.raises(DatabaseUnavailable):
            await pool.fetch_row(SELECT_ONE)
        with pytest.raises(Exception) as raised:  # noqa: PT011 (what is asserted is its class)
            async with engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
        assert is_transient(raised.value)
        assert refused_before_running(raised.value)
    finally:
        await pool.close()
        await engine.dispose()
