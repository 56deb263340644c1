"""Personal search through the core (§7): the worker ranks with the core's configured profile,
the core re-checks ownership and deletion before answering the member."""

from __future__ import annotations

import asyncio
import socket

from sqlalchemy import text

from tests.core import support as facts
from tests.core.harness import bearer
from tests.core.support import created_and_completed

NOTES = {
    "quiet": "조용한 카페, 노트북 작업하기 좋고 콘센트 많음",
    "kids": "아이와 함께 가기 좋은 넓은 공원, 놀이터 있음",
}


async def _search(core, member_id, query, limit=20):
    return await core.client.post(
        "/api/v1/search", json={"query": query, "limit": limit}, headers=bearer(member_id)
    )


async def test_search_returns_only_the_members_own_live_records(core, engine):
    quiet = await created_and_completed(core, engine, 1, NOTES["quiet"], "a")
    kids = await created_and_completed(core, engine, 1, NOTES["kids"], "b")
    others = await created_and_completed(core, engine, 2, NOTES["quiet"], "a")

    mine = await _search(core, 1, NOTES["quiet"])
    theirs = await _search(core, 2, NOTES["quiet"])

    assert mine.status_code == 200
    results = mine.json()["results"]
    assert [r["contextId"] for r in results] == [quiet["contextId"], kids["contextId"]]
    assert results[0]["similarity"] > results[1]["similarity"]
    assert [r["recordId"] for r in theirs.json()["results"]] == [others["recordId"]]


async def test_search_hides_a_context_the_worker_still_ranks_but_core_has_deleted(core, engine):
    """The core's re-check (§7): a hit whose context is deleted in core is not shown, even if
    its vector were still live (here: deleted in core without the ai side's cancellation)."""
    first = await created_and_completed(core, engine, 1, NOTES["quiet"], "a")
    second = await created_and_completed(core, engine, 1, NOTES["kids"], "b")
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE core.context SET deleted_at = now() WHERE id = :id"),
            {"id": first["contextId"]},
        )

    results = (await _search(core, 1, NOTES["quiet"])).json()["results"]

    assert [r["contextId"] for r in results] == [second["contextId"]]


async def test_search_after_an_edit_finds_the_new_context_only(core, engine):
    """Scenario 3."""
    created = await created_and_completed(core, engine, 1, NOTES["quiet"], "a")
    replaced = await core.client.put(
        f"/api/v1/contexts/{created['contextId']}", json={"body": NOTES["kids"]}, headers=bearer(1)
    )
    new_id = replaced.json()["contextId"]
    async with asyncio.timeout(15):
        while (await facts.state(engine, new_id)).statuses != ("COMPLETED", "COMPLETED"):  # noqa: ASYNC110
            await asyncio.sleep(0.05)  # polls the database: no event to wait on

    results = (await _search(core, 1, NOTES["quiet"])).json()["results"]

    assert [r["contextId"] for r in results] == [new_id]


async def test_search_validation_and_worker_outage(core_with_fake_worker):
    blank = await _search(core_with_fake_worker, 1, " \u200b ")
    too_many = await _search(core_with_fake_worker, 1, "카페", limit=101)
    unauthenticated = await core_with_fake_worker.client.post(
        "/api/v1/search", json={"query": "카페"}
    )
    # The fake worker does not serve search: the core answers 502, not 500.
    upstream = await _search(core_with_fake_worker, 1, "카페")

    assert (blank.status_code, blank.json()) == (
        422,
        {
            "detail": "invalid request",
            "errors": [{"loc": ["body", "query"], "msg": "query is blank", "type": "value_error"}],
        },
    )
    assert too_many.status_code == 422
    assert unauthenticated.status_code == 401
    assert upstream.status_code == 502


async def test_search_with_no_reachable_worker_is_503_with_retry_after(make_core):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with make_core(f"http://127.0.0.1:{port}") as core:
        response = await _search(core, 1, "카페")

    assert response.status_code == 503
    assert response.headers["Retry-After"] == "5"
