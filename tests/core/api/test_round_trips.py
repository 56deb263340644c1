"""What each client operation costs the database: round trips counted on the wire.

The core runs with its database URL through a TCP proxy that counts the server's
``ReadyForQuery`` messages (``tests.fault_proxy``), one per round trip the core waited for
(``BEGIN``, each statement, ``COMMIT``, a checkout ping). One pooled connection, warmed up, so
prepared statements are reused as in production. The workers refuse with a long
``Retry-After``, so the after-commit dispatch holds each request without touching the
database and only the request itself is counted; the dispatch's own counting statement is
pinned separately. Real HTTP, real PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import SimpleNamespace

from core_service.service.dispatch import DispatchRequest
from tests.core import support as facts
from tests.core.harness import bearer, core_settings, running_core
from tests.fault_proxy import fault_proxy

# Pinned per operation (docs/scaling.md "The core's database round trips"): a write is one
# statement in a transaction of its own (BEGIN, the statement, COMMIT) that also checks the
# member; a read is one statement that checks the member too.
EXPECTED = {
    "create (new record)": 3,
    "create (existing record)": 3,
    "add": 3,
    "edit": 3,
    "edit (unchanged)": 3,
    "delete": 3,
    "read": 1,
    "read (another member's record id)": 1,
    "read (public view)": 1,
    "keywords": 1,
    "export (one page)": 3,
}


@contextlib.asynccontextmanager
async def _core_through(proxy, fake_worker, pool_size: int = 1):
    settings = core_settings(
        proxy.url,
        fake_worker.base_url,
        database_pool_size=pool_size,
        status_refresh_seconds=3600,
    )
    async with running_core(settings) as core:
        yield core


async def _counted(proxy, request) -> tuple[int, object]:
    before = proxy.round_trips
    response = await request
    return proxy.round_trips - before, response


async def _operations(core, proxy, place: str) -> dict[str, int]:
    client, headers = core.client, bearer(1)
    counts: dict[str, int] = {}

    async def run(name, request, expected_status):
        trips, response = await _counted(proxy, request)
        assert response.status_code == expected_status, (name, response.text)
        counts[name] = trips
        return response.json() if response.content else None

    created = await run(
        "create (new record)",
        client.post(
            "/api/v1/records",
            json={"externalPlaceId": place, "placeName": "카페", "body": "첫 메모"},
            headers=headers,
        ),
        201,
    )
    record_id, context_id = created["recordId"], created["contextId"]
    await run(
        "create (existing record)",
        client.post(
            "/api/v1/records",
            json={"externalPlaceId": place, "placeName": "카페", "body": "둘째 메모"},
            headers=headers,
        ),
        200,
    )
    await run(
        "add",
        client.post(
            f"/api/v1/records/{record_id}/contexts", json={"body": "셋째"}, headers=headers
        ),
        201,
    )
    edited = await run(
        "edit",
        client.put(f"/api/v1/contexts/{context_id}", json={"body": "고친 메모"}, headers=headers),
        200,
    )
    await run(
        "edit (unchanged)",
        client.put(
            f"/api/v1/contexts/{edited['contextId']}", json={"body": "고친 메모"}, headers=headers
        ),
        200,
    )
    await run(
        "delete",
        client.delete(f"/api/v1/contexts/{edited['contextId']}", headers=headers),
        204,
    )
    await run("read", client.get(f"/api/v1/records/{record_id}", headers=headers), 200)
    await run(
        "read (another member's record id)",
        client.get(f"/api/v1/records/{record_id}", headers=bearer(2)),
        404,
    )
    await run(
        "read (public view)",
        client.get(f"/api/v1/public-records/{created['publicId']}", headers=bearer(2)),
        200,
    )
    await run("keywords", client.get("/api/v1/keywords", headers=headers), 200)
    # BEGIN (REPEATABLE READ, READ ONLY), the page, COMMIT.
    await run("export (one page)", client.get("/api/v1/members/me/export", headers=bearer(3)), 200)
    return counts


async def test_each_operation_costs_its_pinned_round_trips(migrated_database, members, fake_worker):
    fake_worker.mode = "refuse"
    fake_worker.retry_after = "60"
    async with fault_proxy(migrated_database) as proxy, _core_through(proxy, fake_worker) as core:
        await _operations(core, proxy, "p-warm")  # the connection opened, statements prepared
        counts = await _operations(core, proxy, "p-counted")

    assert counts == EXPECTED


async def test_a_dispatch_a_worker_took_costs_one_statement(
    migrated_database, members, fake_worker
):
    """The counting statement after a 202 (docs/rescan.md "Budget"), nothing else."""
    async with fault_proxy(migrated_database) as proxy, _core_through(proxy, fake_worker) as core:
        created = await core.create(1, "메모")
        dispatcher = core.app.state.dispatcher
        await dispatcher.drain(5)
        request = DispatchRequest(created.json()["contextId"], 1, 1, "메모", "p", "카페")
        await dispatcher.paused()  # the pause state read now, cached for a second
        before = proxy.round_trips
        await dispatcher.dispatch(request, origin="commit")
        assert proxy.round_trips - before == 1


async def test_a_search_costs_at_most_three_round_trips(migrated_database, members, worker, engine):
    """Personal search (member quotas off; the profile in use and the presets' names cached):
    the member check every authenticated route makes, one statement for the core's lists
    before the worker call, one re-check after it (docs/scaling.md)."""
    async with (
        fault_proxy(migrated_database) as proxy,
        _core_through(proxy, SimpleNamespace(base_url=str(worker.client.base_url))) as core,
    ):
        created = await core.create(1, "조용한 카페 창가 자리", place="p-search")
        assert created.status_code == 201
        context_id = created.json()["contextId"]
        async with asyncio.timeout(15):  # the dispatch and its counting statement are over
            while (await facts.state(engine, context_id)).statuses != ("COMPLETED", "COMPLETED"):  # noqa: ASYNC110
                await asyncio.sleep(0.05)  # polls the database: no event to wait on
        search = {"query": "카페에서", "limit": 10}
        warm = await core.client.post("/api/v1/search", json=search, headers=bearer(1))
        assert warm.status_code == 200
        trips, response = await _counted(
            proxy, core.client.post("/api/v1/search", json=search, headers=bearer(1))
        )

    assert response.status_code == 200
    assert [r["recordId"] for r in response.json()["results"]] == [created.json()["recordId"]]
    assert trips == 3
