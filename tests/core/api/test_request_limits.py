"""What the core reads of a request before it has authenticated the caller, and how much:
a body over ``MAX_REQUEST_BYTES`` is refused 413 before or while it arrives (declared length or
chunked), and a request without a valid token is refused 401 before its body is read, so a
malformed body from an unauthenticated caller costs no parsing (docs/core-service.md).
Real HTTP to a real core on uvicorn; the fake worker shows that nothing was dispatched."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest

from core_service.settings import MAX_REQUEST_BYTES_FLOOR
from tests.core import support as facts
from tests.core.harness import bearer

CAP = MAX_REQUEST_BYTES_FLOOR
TOO_LARGE = {"detail": "request body too large"}
JSON = {"Content-Type": "application/json"}


@pytest.fixture
async def capped_core(make_core, fake_worker):
    """A core whose body cap is the smallest the settings allow."""
    async with make_core(fake_worker.base_url, max_request_bytes=CAP) as core:
        yield core


def _create_body(size: int) -> bytes:
    """A valid ``POST /api/v1/records`` body of exactly ``size`` bytes (an ignored field pads
    it), so only its size can decide the answer."""
    envelope = {"externalPlaceId": "place-1", "placeName": "카페", "body": "조용한 창가", "pad": ""}
    encoded = json.dumps(envelope, ensure_ascii=False).encode()
    padded = dict(envelope, pad="a" * (size - len(encoded)))
    raw = json.dumps(padded, ensure_ascii=False).encode()
    assert len(raw) == size
    return raw


async def _chunks(raw: bytes, size: int = 1024) -> AsyncIterator[bytes]:
    for start in range(0, len(raw), size):
        yield raw[start : start + size]


async def _nothing_written(engine, fake_worker) -> None:
    assert await facts.count(engine, "SELECT count(*) FROM core.record") == 0
    assert await facts.count(engine, "SELECT count(*) FROM core.context") == 0
    assert fake_worker.requests == []


async def test_a_body_at_the_cap_is_accepted_and_one_byte_more_is_413(capped_core, engine):
    client = capped_core.client
    over = await client.post(
        "/api/v1/records", content=_create_body(CAP + 1), headers={**JSON, **bearer(1)}
    )
    assert (over.status_code, over.json()) == (413, TOO_LARGE)
    assert await facts.count(engine, "SELECT count(*) FROM core.context") == 0

    at_cap = await client.post(
        "/api/v1/records", content=_create_body(CAP), headers={**JSON, **bearer(1)}
    )
    assert at_cap.status_code == 201, at_cap.text


async def test_an_oversized_chunked_body_is_cut_off_with_413_and_nothing_written(
    capped_core, fake_worker, engine
):
    """No ``Content-Length``: the cap is counted while the chunks arrive."""
    response = await capped_core.client.post(
        "/api/v1/records",
        content=_chunks(_create_body(4 * CAP)),
        headers={**JSON, **bearer(1)},
    )

    assert "content-length" not in response.request.headers
    assert response.request.headers["transfer-encoding"] == "chunked"
    assert (response.status_code, response.json()) == (413, TOO_LARGE)
    await _nothing_written(engine, fake_worker)


async def test_a_chunked_body_under_the_cap_is_served(capped_core, fake_worker):
    response = await capped_core.client.post(
        "/api/v1/records", content=_chunks(_create_body(CAP // 2)), headers={**JSON, **bearer(1)}
    )

    assert response.request.headers["transfer-encoding"] == "chunked"
    assert response.status_code == 201, response.text
    await fake_worker.wait_for_requests(1)


async def test_an_oversized_declared_length_is_refused_before_the_body_is_sent(
    capped_core, fake_worker, engine
):
    """413 from the headers alone: the body is never sent, and the answer still arrives."""
    status_line = await _answer_without_sending_the_body(
        capped_core.base_url, content_length=10 * CAP, headers=bearer(1)
    )

    assert status_line.startswith(b"HTTP/1.1 413")
    await _nothing_written(engine, fake_worker)


async def test_a_caller_without_a_valid_token_is_refused_before_the_body_is_read(
    capped_core, fake_worker, engine
):
    """401, not 422: the token is checked before FastAPI decodes the body, and a request whose
    body never arrives is answered all the same (the body is not even awaited)."""
    client = capped_core.client
    invalid_json = b'{"externalPlaceId": "place-1", "body": '
    answers = {
        "no token, invalid JSON": await client.post(
            "/api/v1/records", content=invalid_json, headers=JSON
        ),
        "bad token, invalid JSON": await client.post(
            "/api/v1/records",
            content=invalid_json,
            headers={**JSON, "Authorization": "Bearer not-a-token"},
        ),
        "no token, wrong types": await client.put(
            "/api/v1/contexts/1", json={"body": 5}, headers=JSON
        ),
        "basic scheme, search": await client.post(
            "/api/v1/search", content=b"[", headers={**JSON, "Authorization": "Basic eA=="}
        ),
    }
    with_token = await client.post(
        "/api/v1/records", content=invalid_json, headers={**JSON, **bearer(1)}
    )
    status_line = await _answer_without_sending_the_body(
        capped_core.base_url, content_length=CAP // 2, headers={}
    )

    assert {name: r.status_code for name, r in answers.items()} == dict.fromkeys(answers, 401)
    assert all(r.headers["www-authenticate"] == "Bearer" for r in answers.values())
    assert with_token.status_code == 422  # the same body with a token: it is read and refused
    assert status_line.startswith(b"HTTP/1.1 401")
    await _nothing_written(engine, fake_worker)


async def _answer_without_sending_the_body(
    base_url: str, *, content_length: int, headers: dict[str, str]
) -> bytes:
    """The status line answered to ``POST /api/v1/records`` headers that announce a body of
    ``content_length`` bytes which is never sent."""
    url = urlsplit(base_url)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)
    try:
        lines = [
            "POST /api/v1/records HTTP/1.1",
            f"Host: {url.netloc}",
            "Content-Type: application/json",
            f"Content-Length: {content_length}",
            *(f"{name}: {value}" for name, value in headers.items()),
        ]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        await writer.drain()
        return await asyncio.wait_for(reader.readline(), timeout=10)
    finally:
        writer.close()
