"""``GET /api/v1/records``: the member's own active records, newest first by
``(created_at, id)``, keyset pagination, one query per page, the owner's keyword view and the
AI state aggregated over live contexts."""

from __future__ import annotations

import asyncio
import base64
from datetime import UTC, datetime

import pytest
from sqlalchemy import event, text

from tests.core import support as facts
from tests.core.harness import bearer


async def _list(core, member_id, **params):
    return await core.client.get("/api/v1/records", params=params, headers=bearer(member_id))


async def _all_pages(core, member_id, limit, between_pages=None):
    """Every record id of a traversal, page by page; ``between_pages(n)`` runs after page n."""
    seen, cursor, pages = [], None, 0
    while True:
        params = {"limit": limit} | ({"cursor": cursor} if cursor else {})
        answer = await _list(core, member_id, **params)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert len(body["records"]) <= limit
        seen += [r["recordId"] for r in body["records"]]
        pages += 1
        cursor = body["nextCursor"]
        if cursor is None:
            return seen
        if between_pages is not None:
            await between_pages(pages)


async def _set_created_at(engine, record_id, stamp):
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE core.record SET created_at = :t WHERE id = :id"),
            {"t": stamp, "id": record_id},
        )


async def test_lists_only_the_members_own_active_records_newest_first(core_with_fake_worker):
    core = core_with_fake_worker
    first = (await core.create(1, "첫 메모", place="a", name="가게 A")).json()
    second = (await core.create(1, "둘째 메모", place="b", name="가게 B")).json()
    await core.create(2, "남의 메모", place="a")
    deleted = (await core.create(1, "지울 메모", place="c")).json()
    await core.client.delete(f"/api/v1/records/{deleted['recordId']}", headers=bearer(1))

    answer = await _list(core, 1)

    assert answer.status_code == 200
    body = answer.json()
    assert [r["recordId"] for r in body["records"]] == [second["recordId"], first["recordId"]]
    assert body["nextCursor"] is None
    item = body["records"][0]
    assert set(item) == {
        "recordId",
        "publicId",
        "place",
        "contextCount",
        "keywords",
        "createdAt",
        "ai",
    }
    assert item["publicId"] == second["publicId"]
    assert item["place"] == {"externalPlaceId": "b", "name": "가게 B"}
    assert item["contextCount"] == 1
    assert item["keywords"] == []
    assert item["ai"] == {
        "state": "pending",
        "pending": 1,
        "processing": 0,
        "completed": 0,
        "failed": 0,
    }
    assert (await _list(core, 3)).json() == {"records": [], "nextCursor": None}


async def test_equal_creation_times_are_ordered_by_id(core_with_fake_worker, engine):
    core = core_with_fake_worker
    ids = [(await core.create(1, f"메모 {n}", place=f"p{n}")).json()["recordId"] for n in range(5)]
    for record_id in ids:
        await _set_created_at(engine, record_id, datetime(2026, 1, 1, 0, 0, 0, 123456, UTC))

    assert await _all_pages(core, 1, limit=2) == sorted(ids, reverse=True)


async def test_pages_list_each_record_once_while_records_are_created_and_deleted(
    core_with_fake_worker,
):
    """Records existing throughout the traversal appear exactly once; deleted ones never after
    their deletion; new ones (newer than the first page) are not required."""
    core = core_with_fake_worker
    ids = [(await core.create(1, f"메모 {n}", place=f"p{n}")).json()["recordId"] for n in range(9)]
    doomed = ids[1]  # the second oldest: on the last page, deleted before it is read

    async def churn(page_number):
        await core.create(1, f"새 메모 {page_number}", place=f"new{page_number}")
        if page_number == 1:
            await core.client.delete(f"/api/v1/records/{doomed}", headers=bearer(1))

    seen = await _all_pages(core, 1, limit=2, between_pages=churn)

    survivors = [record_id for record_id in reversed(ids) if record_id != doomed]
    assert seen == survivors
    assert len(seen) == len(set(seen))


async def test_concurrent_creates_do_not_disturb_a_traversal(core_with_fake_worker):
    core = core_with_fake_worker
    ids = [(await core.create(1, f"메모 {n}", place=f"p{n}")).json()["recordId"] for n in range(6)]

    async def creates():
        for n in range(6):
            await core.create(1, f"동시 메모 {n}", place=f"c{n}")

    seen, _ = await asyncio.gather(_all_pages(core, 1, limit=1), creates())

    assert [record_id for record_id in seen if record_id in ids] == list(reversed(ids))
    assert len(seen) == len(set(seen))


@pytest.mark.parametrize(
    "limit", ["0", "101", "-1", "x", "1.5", "1_0", " 1", "+1", "01", "1.0", "9" * 30]
)
async def test_a_limit_out_of_range_is_422(core_with_fake_worker, limit):
    assert (await _list(core_with_fake_worker, 1, limit=limit)).status_code == 422


async def test_limit_defaults_to_20_and_accepts_100(core_with_fake_worker):
    core = core_with_fake_worker
    for n in range(21):
        await core.create(1, f"메모 {n}", place=f"p{n}")

    default = (await _list(core, 1)).json()
    widest = (await _list(core, 1, limit=100)).json()

    assert len(default["records"]) == 20 and default["nextCursor"] is not None
    assert len(widest["records"]) == 21 and widest["nextCursor"] is None


def _b64(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "cursor",
    [
        "not a cursor!",
        "%%%",
        _b64("2026-01-01T00:00:00+00:00"),
        _b64("2026-01-01T00:00:00/5"),  # no time zone
        _b64("yesterday/5"),
        _b64("2026-01-01T00:00:00+00:00/0"),
        _b64(f"2026-01-01T00:00:00+00:00/{2**63}"),
        _b64("2026-01-01T00:00:00+00:00/5/6"),
        "",
        "A" * 201,
        # Timestamps Python reads but PostgreSQL (or the driver's UTC conversion) cannot hold.
        _b64("0001-01-01T00:00:00+14:00/5"),
        _b64("9999-12-31T23:59:59-14:00/5"),
        _b64("0001-01-01T00:00:00+00:00/5"),
        # Ids that are not canonical ASCII decimal.
        _b64("2026-01-01T00:00:00+00:00/1_0"),
        _b64("2026-01-01T00:00:00+00:00/ 1"),
        _b64("2026-01-01T00:00:00+00:00/1 "),
        _b64("2026-01-01T00:00:00+00:00/+1"),
        _b64("2026-01-01T00:00:00+00:00/01"),
        _b64("2026-01-01T00:00:00+00:00/-1"),
        _b64("2026-01-01T00:00:00+00:00/\u0661"),
        _b64(" 2026-01-01T00:00:00+00:00/5"),
    ],
)
async def test_a_malformed_cursor_is_422(core_with_fake_worker, cursor):
    answer = await _list(core_with_fake_worker, 1, cursor=cursor)
    assert answer.status_code == 422


async def test_another_members_cursor_only_positions_the_callers_own_list(
    core_with_fake_worker,
):
    """A cursor is a position, not a capability: replayed by another member it lists that
    member's own records after the position, never the issuer's."""
    core = core_with_fake_worker
    for n in range(3):
        await core.create(1, f"메모 {n}", place=f"p{n}")
    mine = (await core.create(2, "남의 메모", place="z")).json()
    cursor = (await _list(core, 1, limit=1)).json()["nextCursor"]

    theirs = (await _list(core, 2, cursor=cursor)).json()

    assert mine["recordId"] not in [r["recordId"] for r in theirs["records"]]
    assert theirs == {"records": [], "nextCursor": None}


async def test_unauthenticated_is_401(core_with_fake_worker):
    answer = await core_with_fake_worker.client.get("/api/v1/records")
    assert answer.status_code == 401


async def test_one_query_per_page_whatever_its_size(core_with_fake_worker):
    """Counted on the app's engine: every statement the request runs is the bearer token's
    member check (``core.member``, every route) and one statement for the page."""
    core = core_with_fake_worker
    for n in range(30):
        (await core.create(1, f"메모 {n}", place=f"p{n}")).json()
    for n in range(3):
        await core.client.post(
            "/api/v1/records/1/contexts", json={"body": f"더 {n}"}, headers=bearer(1)
        )
    statements: list[str] = []

    def count(_conn, _cursor, statement, *_args):
        statements.append(statement)

    sync_engine = core.app.state.engine.sync_engine
    event.listen(sync_engine, "before_cursor_execute", count)
    try:
        counts = {}
        for limit in (1, 10, 30):
            statements.clear()
            assert (await _list(core, 1, limit=limit)).status_code == 200
            assert sum("core.member" in sql for sql in statements) == 1, statements
            counts[limit] = len([sql for sql in statements if "core.member" not in sql])
    finally:
        event.remove(sync_engine, "before_cursor_execute", count)

    assert counts == {1: 1, 10: 1, 30: 1}


async def test_ai_state_aggregates_live_contexts(core_with_fake_worker, engine):
    core = core_with_fake_worker
    created = (await core.create(1, "하나", place="a")).json()
    record_id = created["recordId"]
    extra = []
    for body in ("둘", "셋", "넷"):
        answer = await core.client.post(
            f"/api/v1/records/{record_id}/contexts", json={"body": body}, headers=bearer(1)
        )
        extra.append(answer.json()["contextId"])
    first, second, third, fourth = created["contextId"], *extra

    async def set_states(context_id, embedding, keyword):
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "UPDATE ai.context_ai_state SET embedding_status = :e, keyword_status = :k "
                    "WHERE context_id = :id"
                ),
                {"e": embedding, "k": keyword, "id": context_id},
            )

    async def ai():
        return (await _list(core, 1)).json()["records"][0]["ai"]

    for context_id in (first, second, third, fourth):
        await set_states(context_id, "COMPLETED", "COMPLETED")
    assert await ai() == {
        "state": "completed",
        "pending": 0,
        "processing": 0,
        "completed": 4,
        "failed": 0,
    }
    await set_states(second, "COMPLETED", "PENDING")
    assert (await ai())["state"] == "pending"
    await set_states(third, "PROCESSING", "PENDING")
    assert (await ai())["state"] == "processing"
    await set_states(fourth, "COMPLETED", "FAILED")
    assert await ai() == {
        "state": "failed",
        "pending": 1,
        "processing": 1,
        "completed": 1,
        "failed": 1,
    }
    # A deleted context no longer counts.
    await core.client.delete(f"/api/v1/contexts/{fourth}", headers=bearer(1))
    listed = (await _list(core, 1)).json()["records"][0]
    assert listed["contextCount"] == 3
    assert listed["ai"]["state"] == "processing" and listed["ai"]["failed"] == 0


async def test_keywords_are_the_owners_view_with_the_record_reads_field_names(core, engine):
    created = (await core.create(1, "조용한 카페, 노트북 작업하기 좋고 콘센트 많음")).json()
    async with asyncio.timeout(15):
        while (await facts.state(engine, created["contextId"])).statuses != (  # noqa: ASYNC110
            "COMPLETED",
            "COMPLETED",
        ):
            await asyncio.sleep(0.05)  # polls the database: no event to wait on

    item = (await _list(core, 1)).json()["records"][0]
    read = (
        await core.client.get(f"/api/v1/records/{created['recordId']}", headers=bearer(1))
    ).json()

    assert item["keywords"] == read["keywords"]
    assert item["place"] == read["place"]
    assert item["recordId"] == read["recordId"]
    assert item["ai"]["state"] == "completed"
