"""Search reads from a streaming replica (docs/deployment.md "Replicas and failover"):
``PINLOG_SEARCH_DATABASE_URL`` (the worker's §7 list) and ``PINLOG_CORE_SEARCH_DATABASE_URL``
(the core's own lists) name a real standby built from a small dedicated cluster
(``tests/replication.py``); notes are written, claimed and re-checked on the primary.

The module's core and worker run in this process, over HTTP, against that cluster; the
replica's replay is paused (``pg_wal_replay_pause``) where a test needs it to lag.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.repository import keyword_preset
from app.repository.db import create_engine
from core_service.repository import context_search
from tests.core.harness import RunningCore, bearer, core_settings, make_member, running_core
from tests.core.support import state
from tests.replication import ReplicatedCluster, wait_replayed
from tests.worker.harness import running_worker, worker_settings

MEMBER = 1


@dataclass
class ReplicaSetup:
    cluster: ReplicatedCluster
    primary: AsyncEngine
    replica: AsyncEngine
    core: RunningCore


@pytest.fixture(scope="module")
async def setup(bundled_preset_rows, fake_openai_server) -> AsyncIterator[ReplicaSetup]:
    cluster = await ReplicatedCluster.create()
    primary = create_engine(cluster.primary.url(), pool_size=4)
    replica = create_engine(cluster.replica.url(), pool_size=2)
    try:
        async with primary.begin() as conn:
            await keyword_preset.upsert_all(conn, bundled_preset_rows)
        await make_member(primary, MEMBER)
        worker = worker_settings(
            cluster.primary.url(), fake_openai_server, search_database_url=cluster.replica.url()
        )
        async with running_worker(worker) as running:
            settings = core_settings(
                cluster.primary.url(),
                str(running.client.base_url),
                search_database_url=cluster.replica.url(),
            )
            async with running_core(settings) as core:
                yield ReplicaSetup(cluster, primary, replica, core)
    finally:
        await primary.dispose()
        await replica.dispose()
        await cluster.close()


async def _completed_note(setup: ReplicaSetup, body: str, place: str) -> dict:
    created = (await setup.core.create(MEMBER, body, place=place)).json()
    async with asyncio.timeout(15):
        while (await state(setup.primary, created["contextId"])).statuses != (  # noqa: ASYNC110
            "COMPLETED",
            "COMPLETED",
        ):
            await asyncio.sleep(0.05)
    return created


async def _search(setup: ReplicaSetup, query: str) -> list[dict]:
    response = await setup.core.client.post(
        "/api/v1/search", json={"query": query, "limit": 20}, headers=bearer(MEMBER)
    )
    assert response.status_code == 200, response.text
    return response.json()["results"]


def _ids(results: list[dict]) -> list[int]:
    return [r["contextId"] for r in results]


async def _replay(setup: ReplicaSetup, action: str) -> None:
    statement = {"pause": "SELECT pg_wal_replay_pause()", "resume": "SELECT pg_wal_replay_resume()"}
    async with setup.replica.connect() as conn:
        await conn.execute(text(statement[action]))


async def _replica_sessions(replica: AsyncEngine) -> list[str]:
    """The application names of the other client sessions on the replica's database."""
    async with replica.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT application_name FROM pg_stat_activity "
                "WHERE datname = current_database() AND backend_type = 'client backend' "
                "AND pid <> pg_backend_pid()"
            )
        )
        return [row.application_name for row in rows]


async def test_search_answers_from_the_replica_and_writes_nothing_there(setup: ReplicaSetup):
    note = await _completed_note(setup, "창가 자리가 조용한 카페. 라떼가 맛있음", "replica-a")
    await wait_replayed(setup.cluster.primary.url(), setup.cluster.replica.url())

    results = await _search(setup, "조용한 카페 라떼")

    assert results[0]["contextId"] == note["contextId"]
    assert {"lexical", "semantic"} <= set(results[0]["matchedBy"])
    async with setup.replica.connect() as conn:
        # A standby: it refuses every write, so a search that needed one would have failed.
        assert (await conn.execute(text("SELECT pg_is_in_recovery()"))).scalar_one() is True
    sessions = await _replica_sessions(setup.replica)
    assert "pinlog-core" in sessions  # the core's lists were read here
    assert "" in sessions  # and the worker's search (its sessions carry no name)


async def test_a_note_the_replica_has_not_replayed_is_simply_not_found_yet(setup: ReplicaSetup):
    await _replay(setup, "pause")
    try:
        note = await _completed_note(setup, "비 오는 날 빗소리 들으며 책 읽기 좋은 곳", "replica-b")
        assert note["contextId"] not in _ids(await _search(setup, "빗소리 책"))
    finally:
        await _replay(setup, "resume")
    await wait_replayed(setup.cluster.primary.url(), setup.cluster.replica.url())

    results = await _search(setup, "빗소리 책")
    assert results[0]["contextId"] == note["contextId"]
    assert "lexical" in results[0]["matchedBy"]


async def test_a_note_deleted_on_the_primary_is_never_shown_however_far_the_replica_lags(
    setup: ReplicaSetup,
):
    note = await _completed_note(setup, "강아지 동반 가능한 넓은 테라스 카페", "replica-c")
    await wait_replayed(setup.cluster.primary.url(), setup.cluster.replica.url())
    await _replay(setup, "pause")
    try:
        deleted = await setup.core.client.delete(
            f"/api/v1/records/{note['recordId']}", headers=bearer(MEMBER)
        )
        assert deleted.status_code in (200, 204), deleted.text
        async with setup.replica.connect() as conn:  # the replica still lists it
            lists = await context_search.search_lists(
                conn,
                member_id=MEMBER,
                terms=["강아지", "테라스"],
                named_ids=[],
                floor_share=0.0,
                limit=20,
            )
        assert note["contextId"] in [hit.context_id for hit in lists.lexical]

        assert note["contextId"] not in _ids(await _search(setup, "강아지 테라스"))
    finally:
        await _replay(setup, "resume")


async def test_after_an_edit_the_old_context_is_never_shown_from_a_lagging_replica(
    setup: ReplicaSetup,
):
    """§10 #3 through the core while the replica lags: the edit replaced the context on the
    primary; the replica still lists the old one, the member never sees it, and the new one
    is found once replayed."""
    note = await _completed_note(setup, "주차장 넓은 브런치 카페. 팬케이크 추천", "replica-d")
    await wait_replayed(setup.cluster.primary.url(), setup.cluster.replica.url())
    await _replay(setup, "pause")
    try:
        edited = await setup.core.client.put(
            f"/api/v1/contexts/{note['contextId']}",
            json={"body": "주차장 좁은 브런치 카페. 팬케이크 추천"},
            headers=bearer(MEMBER),
        )
        assert edited.status_code in (200, 201), edited.text
        new_context = edited.json()["contextId"]
        assert new_context != note["contextId"]

        shown = _ids(await _search(setup, "브런치 팬케이크"))
        assert note["contextId"] not in shown
        assert new_context not in shown  # not replayed yet
    finally:
        await _replay(setup, "resume")
    await wait_replayed(setup.cluster.primary.url(), setup.cluster.replica.url())
    async with asyncio.timeout(15):
        while new_context not in _ids(await _search(setup, "브런치 팬케이크")):  # noqa: ASYNC110
            await asyncio.sleep(0.1)  # its stages complete on the primary, then replay
