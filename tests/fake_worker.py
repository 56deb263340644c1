"""A real local HTTP server that speaks the worker's internal API, for core-service tests.

It records every ``POST /internal/v1/context/process`` body and answers by mode: ``accept``
(202), ``refuse`` (503 with ``Retry-After``, as a full worker queue does), ``reject`` (422, as
for a request the worker finds invalid) or ``hang`` (never answers until released), so the
core's dispatch and rescan are tested over real TCP. ``GET /readyz`` answers the worker's
pinned body with ``profile`` and ``preset_version`` (``ready`` false: 503, ``unavailable``).
Runs on the test's event loop (``tests.worker.harness.serving``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

Mode = Literal["accept", "refuse", "reject", "hang"]


class FakeWorker:
    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.mode: Mode = "accept"
        # The Retry-After of a refusal; None sends none.
        self.retry_after: str | None = "5"
        self.requests: list[dict[str, Any]] = []
        self.arrival_times: list[float] = []  # time.monotonic() of each process request
        self.release = asyncio.Event()
        self._arrived = asyncio.Condition()
        # What POST /internal/v1/search answers (a JSON body); None: no such route (404).
        self.search_answer: object | None = None
        # What GET /readyz reports (the worker's pinned body).
        self.ready = True
        self.profile = "openai-text-embedding-3-small-1536-cosine-v1"
        self.preset_version: int | None = 1
        self.app = Starlette(
            routes=[
                Route("/internal/v1/context/process", self._process, methods=["POST"]),
                Route("/internal/v1/search", self._search, methods=["POST"]),
                Route("/readyz", self._readyz, methods=["GET"]),
            ]
        )

    def context_ids(self) -> list[int]:
        return [body["contextId"] for body in self.requests]

    async def wait_for_requests(self, count: int, timeout_seconds: float = 5.0) -> None:
        """Return once ``count`` process requests have arrived; ``TimeoutError`` otherwise."""
        async with asyncio.timeout(timeout_seconds), self._arrived:
            await self._arrived.wait_for(lambda: len(self.requests) >= count)

    async def _readyz(self, _request: Request) -> JSONResponse:
        available = {"available": True, "retryAfterSeconds": None, "reason": None}
        body = {
            "status": "ready" if self.ready else "unavailable",
            "mode": "online",
            "profile": self.profile,
            "presetVersion": self.preset_version,
            "providers": {"embedding": available, "judge": available},
        }
        return JSONResponse(body, status_code=200 if self.ready else 503)

    async def _search(self, request: Request) -> JSONResponse:
        if self.search_answer is None:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        return JSONResponse(self.search_answer)

    async def _process(self, request: Request) -> JSONResponse:
        if request.headers.get("X-Internal-Secret") != self.secret:
            return JSONResponse({"detail": "unauthorized"}, status_code=401)
        body = await request.json()
        async with self._arrived:
            self.requests.append(body)
            self.arrival_times.append(time.monotonic())
            self._arrived.notify_all()
        if self.mode == "refuse":
            headers = {} if self.retry_after is None else {"Retry-After": self.retry_after}
            return JSONResponse({"detail": "worker queue full"}, status_code=503, headers=headers)
        if self.mode == "reject":
            return JSONResponse({"detail": "invalid request"}, status_code=422)
        if self.mode == "hang":
            await self.release.wait()
        return JSONResponse({"contextId": body["contextId"]}, status_code=202)
