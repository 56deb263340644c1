"""``GET /api/v1/keywords`` (the vocabulary, cached by the client with an ETag) and ``GET
/api/v1/members/me/export`` (a member's own data, streamed from one snapshot, priced as a
write): docs/core-service.md "Keywords" and "Export". Real HTTP, real PostgreSQL."""

from __future__ import annotations

import json

import httpx
import pytest
from sqlalchemy import text

from tests.core.harness import bearer, core_settings, running_core
from tests.fault_proxy import fault_proxy
from tests.worker.support import make_keyword, make_preset, set_statuses


async def _presets(engine) -> None:
    await make_preset(engine, preset_id=1, code="PUBLIC_ONE", visibility="PUBLIC")
    await make_preset(engine, preset_id=2, code="PRIVATE_ONE", visibility="PRIVATE_ONLY")
    await make_preset(engine, preset_id=3, code="BLOCKED_ONE", visibility="BLOCKED")
    await make_preset(engine, preset_id=4, code="RETIRED_ONE", is_active=False)


async def test_the_vocabulary_lists_active_unblocked_presets_the_same_for_every_member(
    core_with_fake_worker, engine
):
    await _presets(engine)
    client = core_with_fake_worker.client

    first = await client.get("/api/v1/keywords", headers=bearer(1))
    second = await client.get("/api/v1/keywords", headers=bearer(2))
    unauthenticated = await client.get("/api/v1/keywords")

    assert first.status_code == 200
    assert [(k["code"], k["visibility"]) for k in first.json()["keywords"]] == [
        ("PUBLIC_ONE", "PUBLIC"),
        ("PRIVATE_ONE", "PRIVATE_ONLY"),
    ]
    assert set(first.json()["keywords"][0]) == {"code", "displayName", "category", "visibility"}
    assert (second.content, second.headers["etag"]) == (first.content, first.headers["etag"])
    assert first.headers["cache-control"] == "private, max-age=300"
    # An error is never cached.
    assert unauthenticated.status_code == 401
    assert unauthenticated.headers["cache-control"] == "no-store"


async def test_a_cached_vocabulary_is_answered_304_until_a_preset_changes(
    core_with_fake_worker, engine
):
    await _presets(engine)
    client = core_with_fake_worker.client
    etag = (await client.get("/api/v1/keywords", headers=bearer(1))).headers["etag"]

    forms = (etag, f"W/{etag}", f'"other", {etag}', "*")
    same = [
        await client.get("/api/v1/keywords", headers={**bearer(2), "If-None-Match": form})
        for form in forms
    ]
    other = await client.get("/api/v1/keywords", headers={**bearer(1), "If-None-Match": '"other"'})
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE ai.keyword_preset SET display_name = '새 이름' WHERE id = 1")
        )
    changed = await client.get("/api/v1/keywords", headers={**bearer(1), "If-None-Match": etag})

    for answer in same:
        assert answer.status_code == 304
        assert answer.content == b""
        assert answer.headers["etag"] == etag
        assert answer.headers["cache-control"] == "private, max-age=300"
    assert other.status_code == 200
    assert changed.status_code == 200
    assert changed.headers["etag"] != etag
    assert changed.json()["keywords"][0]["displayName"] == "새 이름"


async def _export(client, member: int) -> httpx.Response:
    return await client.get("/api/v1/members/me/export", headers=bearer(member))


async def test_an_export_holds_the_members_own_data_only(core_with_fake_worker, engine):
    core = core_with_fake_worker
    await _presets(engine)
    cafe = (await core.create(1, "창가 자리 조용한 카페", place="cafe", name="동네 카페")).json()
    added = await core.client.post(
        f"/api/v1/records/{cafe['recordId']}/contexts", json={"body": "콘센트 많음"},
        headers=bearer(1),
    )  # fmt: skip
    edited = await core.client.put(
        f"/api/v1/contexts/{added.json()['contextId']}", json={"body": "콘센트 아주 많음"},
        headers=bearer(1),
    )  # fmt: skip
    soup = (await core.create(1, "국밥 한 그릇", place="soup")).json()
    await core.client.delete(f"/api/v1/records/{soup['recordId']}", headers=bearer(1))
    theirs = (await core.create(2, "남의 비밀 메모", place="cafe")).json()
    judged = cafe["contextId"]
    await set_statuses(
        engine, context_id=judged, embedding_status="COMPLETED", keyword_status="COMPLETED"
    )
    for keyword_id in (1, 2, 3, 4):
        await make_keyword(engine, context_id=judged, keyword_id=keyword_id)

    answer = await _export(core.client, 1)

    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    assert answer.headers["cache-control"] == "no-store"
    document = answer.json()
    assert document["memberId"] == 1
    (record,) = document["records"]  # the deleted record and member 2's are not there
    assert record["recordId"] == cafe["recordId"]
    assert record["publicId"] == cafe["publicId"]
    assert record["place"] == {"externalPlaceId": "cafe", "name": "동네 카페"}
    assert [k["code"] for k in record["keywords"]] == ["PRIVATE_ONE", "PUBLIC_ONE"]
    contexts = {c["contextId"]: c for c in record["contexts"]}
    assert set(contexts) == {judged, edited.json()["contextId"]}  # live notes only
    assert contexts[judged]["body"] == "창가 자리 조용한 카페"
    assert contexts[judged]["ai"] == {"state": "completed"}
    assert {k["code"] for k in contexts[judged]["keywords"]} == {"PUBLIC_ONE", "PRIVATE_ONE"}
    assert contexts[edited.json()["contextId"]]["ai"] == {"state": "pending"}
    assert "남의 비밀 메모" not in answer.text
    assert str(theirs["recordId"]) not in json.dumps(record["recordId"])


async def test_an_export_streams_every_page_of_one_snapshot(
    migrated_database, members, fake_worker, engine
):
    """Pages of two records, the second page's statement held at the proxy while the oldest
    record is deleted: the document is whole, every record once, newest first, and the deleted
    record is still there (the export reads the snapshot it began with)."""
    async with (
        fault_proxy(migrated_database) as proxy,
        running_core(core_settings(proxy.url, fake_worker.base_url)) as core,
    ):
        core.app.state.exports._page_records = 2
        created = [
            (await core.create(1, f"메모 {n}", place=f"p-{n}")).json()["recordId"] for n in range(5)
        ]
        proxy.freeze_on(_second_export_page)
        chunks = []
        async with core.client.stream(
            "GET", "/api/v1/members/me/export", headers=bearer(1)
        ) as response:
            assert response.status_code == 200
            async for chunk in response.aiter_raw():
                chunks.append(chunk)
                if len(chunks) == 1:  # the second page waits at the proxy
                    async with engine.begin() as conn:
                        await conn.execute(
                            text("UPDATE core.record SET deleted_at = now() WHERE id = :id"),
                            {"id": created[0]},
                        )
                    proxy.thaw()

    document = json.loads(b"".join(chunks))
    assert len(chunks) >= 3  # the opening with the first page, then two further pages
    assert [r["recordId"] for r in document["records"]] == sorted(created, reverse=True)


async def test_an_export_takes_a_token_of_the_members_write_bucket(make_core, fake_worker, engine):
    async with make_core(fake_worker.base_url, member_writes_per_minute=1, member_burst=1) as core:
        first = await _export(core.client, 1)
        second = await _export(core.client, 1)
        other_member = await _export(core.client, 2)
        write = await core.create(1, "메모")

    assert first.status_code == 200
    assert second.status_code == 429
    assert "retry-after" in second.headers
    assert other_member.status_code == 200
    assert write.status_code == 429  # the same bucket as writes


async def test_a_withdrawn_member_cannot_export(core_with_fake_worker):
    client = core_with_fake_worker.client
    await core_with_fake_worker.create(1, "메모")
    assert (await client.delete("/api/v1/members/me", headers=bearer(1))).status_code == 204

    assert (await _export(client, 1)).status_code == 401


def _second_export_page(statement: str, statements: list[str]) -> bool:
    return "page.created_at" in statement and sum("page.created_at" in s for s in statements) == 2


@pytest.mark.parametrize("cut", ["client gone", "database stalled"])
async def test_an_export_that_stalls_ends_and_returns_its_connection(
    cut, migrated_database, members, fake_worker, engine
):
    """The database stops answering at the second page; the client waits for it (the chunk's
    deadline, here 1 s, ends the export), or goes away meanwhile. Either way the export ends,
    its connection is returned (one pooled connection, so the next request proves it), and a
    cut-off document ends without its close, so no partial document passes as whole."""
    async with fault_proxy(migrated_database) as proxy:
        settings = core_settings(
            proxy.url, fake_worker.base_url, database_pool_size=1, request_timeout_seconds=1
        )
        async with running_core(settings) as core:
            core.app.state.exports._page_records = 1
            for n in range(3):
                await core.create(1, f"메모 {n}", place=f"p-{n}")
            proxy.freeze_on(_second_export_page)
            received, outcome = b"", "whole"
            async with core.client.stream(
                "GET", "/api/v1/members/me/export", headers=bearer(1)
            ) as response:
                assert response.status_code == 200
                try:
                    async for chunk in response.aiter_raw():
                        received += chunk
                        if cut == "client gone":
                            break  # the client closes the connection after the first chunk
                except httpx.RemoteProtocolError:
                    outcome = "cut off"
            proxy.thaw()
            after = await core.client.get("/api/v1/records", headers=bearer(1))

    if cut == "database stalled":
        assert outcome == "cut off"
        assert received.startswith(b'{"memberId":1,')
        with pytest.raises(json.JSONDecodeError):
            json.loads(received)
    assert after.status_code == 200
    assert len(after.json()["records"]) == 3
