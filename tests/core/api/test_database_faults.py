"""The core when the database fails the ways production databases do (§6, §8): a silent peer
(a TCP proxy that stops forwarding while every socket stays open) and a server that turns
read-only (a failover to a standby, or ``default_transaction_read_only``). Every request ends
within its deadline with 503 + ``Retry-After``, nothing is half-written, readiness says so,
and the service recovers by itself once the database does. Real HTTP, real PostgreSQL, a real
proxy."""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy import text

from core_service.errors import UnavailableError
from core_service.repository.db import ENGINE_PARAMETERS
from tests.core import support as facts
from tests.core.harness import bearer, core_settings, running_core
from tests.e2e.observe import wait_until
from tests.fault_proxy import fault_proxy, set_read_only

REQUEST_TIMEOUT = 2.0  # command deadline: half of it (core_service.repository.db)
CONNECT_TIMEOUT = ENGINE_PARAMETERS.connect_timeout_seconds


async def _recovers(core, member_id: int, note: str, *, within: float) -> float:
    """Seconds until a create succeeds again (and /readyz is 200)."""
    started = time.monotonic()
    while True:
        response = await core.create(member_id, note)
        ready = await core.client.get("/readyz")
        if response.status_code in (200, 201) and ready.status_code == 200:
            return time.monotonic() - started
        assert response.status_code == 503, response.text
        assert time.monotonic() - started < within, "the core never recovered"
        await asyncio.sleep(0.2)


async def test_a_silent_database_ends_creates_and_rescans_in_bounded_time_then_recovers(
    members, fake_worker, migrated_database, engine
):
    async with fault_proxy(migrated_database) as proxy:
        settings = core_settings(
            proxy.url, fake_worker.base_url, request_timeout_seconds=REQUEST_TIMEOUT
        )
        async with running_core(settings) as core:
            await _silent_database(core, proxy)
    contexts = await facts.count(engine, "SELECT count(*) FROM core.context")
    assert contexts == 2, "the frozen create left nothing behind"
    assert not any((await facts.invariant_violations(engine)).values())


async def _silent_database(core, proxy) -> None:
    assert (await core.create(1, "before the freeze")).status_code == 201
    proxy.freeze()

    started = time.monotonic()
    frozen = await core.create(1, "while frozen")
    elapsed = time.monotonic() - started
    assert frozen.status_code == 503 and frozen.headers["Retry-After"]
    assert elapsed < REQUEST_TIMEOUT + 1.0

    started = time.monotonic()
    ready = await core.client.get("/readyz")
    assert ready.status_code == 503 and time.monotonic() - started < 2.0

    # A rescan pass ends too: a transient database error, within its deadlines.
    started = time.monotonic()
    with pytest.raises(UnavailableError):
        await core.scheduler().run_once()
    # At most a command deadline, then a connect deadline for a replacement connection.
    assert time.monotonic() - started < REQUEST_TIMEOUT / 2 + CONNECT_TIMEOUT + 1.0

    proxy.thaw()
    assert await _recovers(core, 2, "after the thaw", within=10.0) < 10.0


# Waits (up to 5 s) until each backend has exited: a request sent while one is still going
# down may see its connection close mid-statement, a write the core rightly does not retry.
TERMINATE_CORE = text(
    "SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity "
    "WHERE datname = current_database() AND application_name = 'pinlog-core' "
    "AND pid <> pg_backend_pid()"
)


async def _every_dispatch_counted(engine) -> bool:
    """Whether the core has counted the dispatch of every context (its background write, not
    the requests this test times against the terminations)."""
    uncounted = "SELECT count(*) FROM ai.context_ai_state WHERE last_dispatch_at IS NULL"
    return await facts.count(engine, uncounted) == 0


async def _admin(engine, sql) -> None:
    async with engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(text(sql) if isinstance(sql, str) else sql)


async def test_a_read_only_database_answers_503_and_not_ready_then_recovers_without_restart(
    core_with_fake_worker, engine
):
    core = core_with_fake_worker
    assert (await core.create(1, "before")).status_code == 201
    try:
        await set_read_only(engine, read_only=True)
        await _admin(engine, TERMINATE_CORE)  # a failover: every session is new, read-only
        for attempt in range(3):
            refused = await core.create(1, f"read-only {attempt}")
            assert refused.status_code == 503, refused.text
            assert refused.headers["Retry-After"]
            assert (await core.client.get("/readyz")).status_code == 503
    finally:
        await set_read_only(engine, read_only=False)
    # Sessions opened while read-only stay read-only: the pools must replace them by
    # themselves.
    assert await _recovers(core, 2, "writable again", within=5.0) < 5.0
    contexts = await facts.count(engine, "SELECT count(*) FROM core.context")
    assert contexts == 2


async def test_sessions_the_server_ended_while_pooled_cost_no_request(
    core_with_fake_worker, engine
):
    """No checkout ping on the request pool: a pooled connection whose session the server
    ended (a restart, a failover, a terminated backend) is replaced at checkout, or the write
    refused on it runs once more on a fresh one. Every request answers as if nothing had
    happened, and nothing is written twice."""
    core = core_with_fake_worker
    created = await core.create(1, "before")
    assert created.status_code == 201
    record_id = created.json()["recordId"]
    for round_number in range(3):
        await wait_until(lambda: _every_dispatch_counted(engine), what="the dispatches counted")
        await _admin(engine, TERMINATE_CORE)
        added = await core.client.post(
            f"/api/v1/records/{record_id}/contexts",
            json={"body": f"after termination {round_number}"},
            headers=bearer(1),
        )
        assert added.status_code == 201, added.text
        again = await core.create(1, f"create after termination {round_number}")
        assert again.status_code == 200, again.text
    contexts = await facts.count(engine, "SELECT count(*) FROM core.context")
    assert contexts == 7
