"""The overall request deadline (``pinlog_platform.http.request_deadline``) over real HTTP:
a request past it answers 503 with ``Retry-After`` after its cleanup ran; one that began to
commit, or whose response started, is never cut; one that answers in time is untouched."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from pinlog_platform.db.commit_watch import committing
from pinlog_platform.http.request_deadline import RequestDeadlineMiddleware
from tests.worker.harness import serving

# Request deadlines measured against the clock: alone, in the serial pass.
pytestmark = pytest.mark.serial

DEADLINE_SECONDS = 0.3
SLOW_SECONDS = 1.0


def _app(events: list[str]) -> RequestDeadlineMiddleware:
    async def fast(_request):
        return JSONResponse({"ok": True})

    async def slow(_request):
        try:
            await asyncio.sleep(SLOW_SECONDS)
        finally:
            events.append("slow cleaned up")
        return JSONResponse({"ok": True})

    async def commits_slowly(_request):
        with committing():
            await asyncio.sleep(SLOW_SECONDS)
        return JSONResponse({"committed": True})

    async def streams_slowly(_request):
        async def body():
            yield b"first "
            await asyncio.sleep(SLOW_SECONDS)
            yield b"last"

        return StreamingResponse(body())

    expired: list[None] = []
    app = Starlette(
        routes=[
            Route("/fast", fast),
            Route("/slow", slow),
            Route("/commit", commits_slowly),
            Route("/stream", streams_slowly),
        ]
    )
    middleware = RequestDeadlineMiddleware(
        app, seconds=DEADLINE_SECONDS, retry_after="7", on_expiry=lambda: expired.append(None)
    )
    middleware.expired = expired  # type: ignore[attr-defined]
    return middleware


async def test_a_request_past_its_deadline_answers_503_after_its_cleanup():
    events: list[str] = []
    app = _app(events)
    async with serving(app) as base_url, httpx.AsyncClient(base_url=base_url) as client:
        loop = asyncio.get_running_loop()
        started = loop.time()
        response = await client.get("/slow")
        elapsed = loop.time() - started

        assert response.status_code == 503
        assert response.headers["Retry-After"] == "7"
        assert response.json() == {"detail": "request deadline exceeded"}
        assert DEADLINE_SECONDS <= elapsed < SLOW_SECONDS
        assert events == ["slow cleaned up"]
        assert len(app.expired) == 1  # type: ignore[attr-defined]
        # The connection and the task serving it are fine for the next request.
        assert (await client.get("/fast")).json() == {"ok": True}


async def test_a_request_that_began_to_commit_is_never_cut():
    app = _app([])
    async with serving(app) as base_url, httpx.AsyncClient(base_url=base_url) as client:
        response = await client.get("/commit")

    assert response.status_code == 200 and response.json() == {"committed": True}
    assert app.expired == []  # type: ignore[attr-defined]


async def test_a_response_that_started_is_never_replaced():
    app = _app([])
    async with serving(app) as base_url, httpx.AsyncClient(base_url=base_url) as client:
        response = await client.get("/stream")

    assert response.status_code == 200 and response.text == "first last"
    assert app.expired == []  # type: ignore[attr-defined]


async def test_requests_in_time_are_untouched():
    app = _app([])
    async with serving(app) as base_url, httpx.AsyncClient(base_url=base_url) as client:
        answers = await asyncio.gather(*(client.get("/fast") for _ in range(20)))

    assert [a.status_code for a in answers] == [200] * 20
    assert app.expired == []  # type: ignore[attr-defined]
