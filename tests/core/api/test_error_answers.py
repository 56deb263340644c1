"""The client API's answers against its OpenAPI document (``docs/openapi/core-client.json``) and
docs/core-service.md: every route, driven over real HTTP into every condition a client can
provoke, answers only statuses the document lists for that route, every error in one shape
(``{"detail": string}``; a 422 adds ``errors``), and one condition answers the same bytes
however it is reached. Real core on uvicorn, real PostgreSQL, the fake worker."""

from __future__ import annotations

import asyncio
import json
import re
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

from core_service.settings import MAX_REQUEST_BYTES_FLOOR
from tests.core.harness import bearer, make_member

ROOT = Path(__file__).resolve().parents[3]
DOCUMENT = json.loads((ROOT / "docs" / "openapi" / "core-client.json").read_text("utf-8"))
CAP = MAX_REQUEST_BYTES_FLOOR
METHODS = ("get", "post", "put", "delete", "patch")
MISSING_ID = 9_000_000
# Answers no client request can provoke on a healthy core: a fault of ours (500) and a
# database or worker away, or a deadline passed (503). They are driven in
# tests/core/api/test_database_faults.py, test_ops_and_headers.py, test_search_api.py and
# tests/platform/test_request_deadline.py.
NOT_PROVOKED_HERE = {"500", "503"}
# A withdrawn member, a member whose write and search buckets the 429 pass empties.
WITHDRAWN, LIMITED = 3, 4


def _routes() -> list[tuple[str, str]]:
    return [
        (path, method)
        for path, operations in DOCUMENT["paths"].items()
        if path.startswith("/api/v1/")
        for method in operations
    ]


def _documented(path: str, method: str) -> set[str]:
    return set(DOCUMENT["paths"][path][method]["responses"])


def _has_body(path: str, method: str) -> bool:
    return "requestBody" in DOCUMENT["paths"][path][method]


def _url(path: str, record_id: int | str, context_id: int | str) -> str:
    return path.replace("{record_id}", str(record_id)).replace("{context_id}", str(context_id))


def _valid_body(path: str) -> dict[str, object]:
    if path.endswith("/search"):
        return {"query": "카페", "limit": 5}
    if path == "/api/v1/records":
        return {"externalPlaceId": "place-x", "placeName": "카페", "body": "창가 자리"}
    return {"body": "새 메모"}


async def _chunks(raw: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(raw), 1024):
        yield raw[start : start + 1024]


def _assert_error_shape(status: int, body: bytes) -> None:
    answer = json.loads(body)
    assert isinstance(answer.get("detail"), str), (status, body)
    if status == 422:
        assert answer["detail"] == "invalid request"
        assert answer["errors"], body
        for item in answer["errors"]:
            assert set(item) == {"loc", "msg", "type"}, body
            assert isinstance(item["loc"], list) and isinstance(item["msg"], str)
        assert set(answer) == {"detail", "errors"}
    else:
        assert set(answer) <= {"detail", "replacedBy"}, body


class Answers:
    """Statuses seen per route; each error body checked for the one shape as it arrives."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self.seen: dict[tuple[str, str], set[str]] = defaultdict(set)

    async def send(self, route: tuple[str, str], url: str, **kwargs) -> httpx.Response:
        answer = await self.client.request(route[1].upper(), url, **kwargs)
        self.seen[route].add(str(answer.status_code))
        if answer.status_code >= 400:
            _assert_error_shape(answer.status_code, answer.content)
        return answer


async def _provoke_on(answers: Answers, route: tuple[str, str], record_id: int, context_id: int):
    """Every condition a client can provoke on one route, refused before anything is written
    (a withdrawn member's create is refused by its own statement)."""
    path, method = route
    url = _url(path, record_id, context_id)
    own = {**bearer(1), "Content-Type": "application/json"}
    await answers.send(route, url)  # no token
    await answers.send(route, url, headers={"Authorization": "Bearer not-a-token"})
    await answers.send(route, url, headers=bearer(WITHDRAWN), json=_valid_body(path))
    await answers.send(route, url, headers=own, content=b"x" * (CAP + 1))
    other = next(m for m in METHODS if m not in DOCUMENT["paths"][path])
    wrong = await answers.send((path, other), url, headers=own)
    answers.seen[route].add(str(wrong.status_code))  # the path's answer to this route's caller
    if "{" in path:
        await answers.send(route, _url(path, MISSING_ID, MISSING_ID), headers=own,
                           json=_valid_body(path))  # fmt: skip
        await answers.send(route, _url(path, "01", "01"), headers=own)
    if _has_body(path, method):
        # Streamed: cut off as it arrives (a route that reads no body never reads it).
        await answers.send(route, url, headers=own, content=_chunks(b"x" * (4 * CAP)))
        for raw in (b'{"body": "\xff\xfe"}', b"[" * 5000, b"{", b"{}", b'{"body": 5}'):
            await answers.send(route, url, headers=own, content=raw)
        await answers.send(route, url, headers=own, json={**_valid_body(path), "body": " "})


async def _provoke_every_condition(answers: Answers, record_id: int, context_id: int) -> None:
    """Every condition a client can provoke, on every route of the document (routes side by
    side: no condition changes what another route answers)."""
    await asyncio.gather(
        *(_provoke_on(answers, route, record_id, context_id) for route in _routes())
    )
    listing = ("/api/v1/records", "get")
    for query in ("limit=0", "limit=01", "cursor=xyz", "keyword=NO_SUCH_CODE", "keyword=lower"):
        await answers.send(listing, f"/api/v1/records?{query}", headers=bearer(1))
    search = ("/api/v1/search", "post")
    await answers.send(search, "/api/v1/search", headers=bearer(1), json=_valid_body("/search"))


async def _provoke_conflicts(answers: Answers, record_id: int) -> None:
    """409: a change to a deleted context, and the deletion of a record's last context."""
    own = bearer(1)
    added = await answers.client.post(
        f"/api/v1/records/{record_id}/contexts", json={"body": "하나 더"}, headers=own
    )
    assert added.status_code == 201, added.text
    extra = added.json()["contextId"]
    put = ("/api/v1/contexts/{context_id}", "put")
    delete = ("/api/v1/contexts/{context_id}", "delete")
    assert (await answers.send(delete, f"/api/v1/contexts/{extra}", headers=own)).status_code == 204
    await answers.send(delete, f"/api/v1/contexts/{extra}", headers=own)
    await answers.send(put, f"/api/v1/contexts/{extra}", headers=own, json={"body": "고침"})
    last = await answers.client.post(
        "/api/v1/records", json=_valid_body("/api/v1/records") | {"externalPlaceId": "solo"},
        headers=own,
    )  # fmt: skip
    await answers.send(delete, f"/api/v1/contexts/{last.json()['contextId']}", headers=own)


async def _provoke_quotas(answers: Answers, record_id: int, context_id: int) -> None:
    """429 on every route that takes a quota token: the member's first write and first search
    (refused as invalid, nothing written) empty its buckets of one token."""
    limited = {**bearer(LIMITED), "Content-Type": "application/json"}
    await answers.client.post("/api/v1/records", headers=limited, content=b"{}")
    await answers.client.post("/api/v1/search", headers=limited, content=b"{}")
    for route in _routes():
        path, _method = route
        if "429" in _documented(*route):
            await answers.send(route, _url(path, record_id, context_id), headers=limited,
                               json=_valid_body(path))  # fmt: skip


async def test_every_answer_of_every_route_is_one_its_document_lists_in_the_one_shape(
    make_core, fake_worker, engine
):
    for member_id in (WITHDRAWN, LIMITED):
        await make_member(engine, member_id)
    async with make_core(fake_worker.base_url, max_request_bytes=CAP) as core:
        assert (
            await core.client.delete("/api/v1/members/me", headers=bearer(WITHDRAWN))
        ).status_code == 204
        created = (await core.create(1, "조용한 창가")).json()
        record_id, context_id = created["recordId"], created["contextId"]
        answers = Answers(core.client)
        await _provoke_every_condition(answers, record_id, context_id)
        await _provoke_conflicts(answers, record_id)
    limits = {"member_burst": 1, "member_writes_per_minute": 1, "member_searches_per_minute": 1}
    async with make_core(fake_worker.base_url, **limits) as limited_core:
        limited = Answers(limited_core.client)
        await _provoke_quotas(limited, record_id, context_id)

    for route in _routes():
        seen = answers.seen[route] | limited.seen[route]
        documented = _documented(*route)
        assert seen <= documented, (route, seen - documented)
        errors = {status for status in documented if status >= "400"}
        assert errors - seen <= NOT_PROVOKED_HERE, (route, errors - seen)
    # A method a path does not take: 405 (the document lists it on the path's operations).
    assert all(
        statuses == {"405"}
        for (path, method), statuses in answers.seen.items()
        if method not in DOCUMENT["paths"].get(path, {})
    )


async def test_one_condition_answers_the_same_bytes_however_it_is_reached(
    make_core, fake_worker, engine
):
    await make_member(engine, WITHDRAWN)
    async with make_core(fake_worker.base_url, max_request_bytes=CAP) as core:
        client = core.client
        declared = await client.post("/api/v1/records", headers=bearer(1), content=b"x" * (CAP + 1))
        streamed = await client.post(
            "/api/v1/records", headers=bearer(1), content=_chunks(b"x" * (4 * CAP))
        )
        refused = await client.get("/api/v1/records", headers={"Authorization": "Bearer x.y.z"})
        expired = await client.get("/api/v1/records", headers=bearer(1, ttl_seconds=-3600))
        await client.delete("/api/v1/members/me", headers=bearer(WITHDRAWN))
        withdrawn_read = await client.get("/api/v1/records", headers=bearer(WITHDRAWN))
        withdrawn_write = await core.create(WITHDRAWN, "메모")  # refused by its own statement
        cursor = await client.get("/api/v1/records?cursor=xyz", headers=bearer(1))
        limit = await client.get("/api/v1/records?limit=0", headers=bearer(1))

    assert (declared.status_code, streamed.status_code) == (413, 413)
    assert declared.content == streamed.content == b'{"detail":"request body too large"}'
    assert {r.status_code for r in (refused, expired, withdrawn_read, withdrawn_write)} == {401}
    assert (
        refused.content
        == expired.content
        == withdrawn_read.content
        == withdrawn_write.content
        == b'{"detail":"invalid or expired token"}'
    )
    # A cursor the core refuses and a query FastAPI refuses: one shape, their own items.
    assert cursor.json() == {
        "detail": "invalid request",
        "errors": [{"loc": ["query", "cursor"], "msg": "malformed cursor", "type": "value_error"}],
    }
    assert limit.json()["detail"] == "invalid request"
    assert [item["loc"] for item in limit.json()["errors"]] == [["query", "limit"]]


def test_the_status_list_of_core_service_md_names_every_status_of_the_document():
    text = (ROOT / "docs" / "core-service.md").read_text("utf-8")
    section = text[text.index("### Errors") :]
    section = section[: section.index("\n## ")]
    listed = set(re.findall(r"^\| (\d{3})\b", section, re.MULTILINE))
    documented = {
        status
        for operations in DOCUMENT["paths"].values()
        for operation in operations.values()
        for status in operation["responses"]
        if status >= "400"
    }
    assert documented == listed
    assert documented == {
        "400",
        "401",
        "404",
        "405",
        "409",
        "413",
        "422",
        "429",
        "500",
        "502",
        "503",
    }
    assert "503" in DOCUMENT["paths"]["/readyz"]["get"]["responses"]
