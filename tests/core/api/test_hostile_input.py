"""Hostile or unusual input to the core service, found by an adversarial review: each a class
of fault with its expected answer (docs/core-service.md)."""

from __future__ import annotations

import asyncio
import time
import unicodedata

from tests.core import support as facts
from tests.core.harness import bearer


async def test_a_combining_mark_newer_than_pythons_unicode_is_stored_not_a_500(
    core_with_fake_worker, engine, caplog
):
    """PostgreSQL's Unicode tables may be newer than Python's (U+10EFD is a mark of Unicode
    15): the database must not re-judge NFC, and no log may quote the note."""
    body = "x\u0301\U00010efd 비밀 메모"
    response = await core_with_fake_worker.create(1, body)

    assert response.status_code == 201, response.text
    assert (await facts.context(engine, response.json()["contextId"])).body == body
    assert not any("비밀" in record.getMessage() for record in caplog.records)


async def test_place_ids_and_names_are_normalised_and_each_owners_name_is_dispatched(
    core_with_fake_worker, fake_worker, engine
):
    nfc, nfd = "가게-1", unicodedata.normalize("NFD", "가게-1")
    first = await core_with_fake_worker.create(1, "첫 메모", place=nfc, name="진짜 이름")
    second = await core_with_fake_worker.create(2, "다른 사람", place=f" {nfd}\u200b", name="가짜")
    blank = await core_with_fake_worker.create(1, "메모", place="\u200b", name="이름")
    nul = await core_with_fake_worker.create(1, "메모", place="p", name="이\x00름")
    await fake_worker.wait_for_requests(2)

    assert (first.status_code, second.status_code) == (201, 201)
    assert await facts.count(engine, "SELECT count(*) FROM core.place") == 1
    assert [r["placeMeta"]["name"] for r in fake_worker.requests] == ["진짜 이름", "가짜"]
    assert (blank.status_code, blank.json()) == (
        422,
        {
            "detail": "invalid request",
            "errors": [
                {
                    "loc": ["body", "externalPlaceId"],
                    "msg": "externalPlaceId is blank",
                    "type": "value_error",
                }
            ],
        },
    )
    assert nul.status_code == 422 and nul.json()["errors"][0]["loc"] == ["body", "placeName"]


async def test_a_client_chosen_method_or_path_creates_no_metric_series(core_with_fake_worker):
    client = core_with_fake_worker.client
    for index in range(20):
        # An invented method (the HTTP parser may refuse it outright) and real ones we do
        # not serve, on paths of the client's choosing.
        method = ("PATCH", "PROPFIND", f"M{index:04X}")[index % 3]
        await client.request(method, f"/nope/{index}")
    body = (await core_with_fake_worker.ops.get("/metrics")).text

    assert 'method="other"' in body and 'route="unmatched"' in body
    assert "M0001" not in body and "/nope/1" not in body


async def test_a_worker_dripping_its_answer_cannot_hold_a_dispatch(make_core, engine):
    """httpx times each read, not the answer: the dispatch has a deadline of its own."""

    async def drip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 202 Accepted\r\nContent-Length: 100000\r\n\r\n")
        try:
            for _ in range(100):
                writer.write(b"x")
                await writer.drain()
                await asyncio.sleep(0.5)  # a misbehaving peer's pace, not a test interleaving
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(drip, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with make_core(
            f"http://127.0.0.1:{port}",
            dispatch_connect_timeout_seconds=0.5,
            dispatch_read_timeout_seconds=1,
        ) as core:
            created = await core.create(1, "메모")
            started = time.monotonic()
            await core.app.state.dispatcher.drain(10)
            drained_in = time.monotonic() - started
    finally:
        server.close()

    assert created.status_code == 201
    assert drained_in < 4  # the attempt's deadline: connect + read + 1 s
    state = await facts.state(engine, created.json()["contextId"])
    assert (state.statuses, state.retry_count) == (("PENDING", "PENDING"), 0)


async def test_search_shows_only_pairs_the_core_confirms_once_per_record(
    core_with_fake_worker, fake_worker
):
    mine = (await core_with_fake_worker.create(1, "내 메모", place="a")).json()
    theirs = (await core_with_fake_worker.create(2, "남의 메모", place="b")).json()
    fake_worker.search_answer = {
        "results": [
            {"recordId": theirs["recordId"], "contextId": mine["contextId"], "similarity": 0.9},
            {"recordId": mine["recordId"], "contextId": mine["contextId"], "similarity": 0.8},
            {"recordId": mine["recordId"], "contextId": mine["contextId"], "similarity": 0.7},
        ]
    }
    search = {"query": "메모", "limit": 5}

    results = await core_with_fake_worker.client.post(
        "/api/v1/search", json=search, headers=bearer(1)
    )
    fake_worker.search_answer = {"results": [{"recordId": "x", "contextId": 2**80}]}
    malformed = await core_with_fake_worker.client.post(
        "/api/v1/search", json=search, headers=bearer(1)
    )

    assert [(r["recordId"], r["contextId"]) for r in results.json()["results"]] == [
        (mine["recordId"], mine["contextId"])
    ]
    assert malformed.status_code == 502
