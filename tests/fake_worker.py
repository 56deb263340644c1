"""A real local HTTP server that speaks the worker's internal API, for core-service tests.

It records every ``POST /internal/v1/context/process`` body and answers by mode: ``accept``
(202), ``refuse`` (503 with ``Retry-After``, as a full worker queue does), ``reject`` (422, as
for a request the worker finds invalid) or ``hang`` (never answers until released), so the
core's dispatch and rescan are tested over real TCP. ``GET /readyz`` answers the worker's
pinned body with ``profile`` and ``preset_version`` (``ready`` false: 503, ``unavailable``).
``ProfileWorker`` is a worker of one embedding profile as it answers during a switch.
Both run on the test's event loop (``tests.worker.harness.serving``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from core_service.service.personal_search import SEARCH_PATH
from core_service.service.process_requests import PROCESS_PATH
from core_service.service.reembed_backfill import BACKFILL_PATH
from tests.worker.backfill_support import backfill_counts

Mode = Literal["accept", "refuse", "reject", "hang"]


def readyz_answer(*, ready: bool, profile: str, version: int | None) -> JSONResponse:
    """The worker's pinned ``GET /readyz`` answer: 200 ``ready``, or 503 ``unavailable``."""
    available = {"available": True, "retryAfterSeconds": None, "reason": None}
    body = {
        "status": "ready" if ready else "unavailable",
        "mode": "online",
        "profile": profile,
        "presetVersion": version,
        "providers": {"embedding": available, "judge": available},
    }
    return JSONResponse(body, status_code=200 if ready else 503)


class FakeWorker:
    def __init__(self, secret: str) -> None:
        self.secret = secret
        self.mode: Mode = "accept"
        # The Retry-After of a refusal; None sends none.
        self.retry_after: str | None = "5"
        self.requests: list[dict[str, Any]] = []
        self.traceparents: list[str | None] = []  # the traceparent header of each request
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
        return readyz_answer(ready=self.ready, profile=self.profile, version=self.preset_version)

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
            self.traceparents.append(request.headers.get("traceparent"))
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


class ProfileWorker:
    """A worker instance of one embedding profile, answering as the worker does during a
    switch (docs/operations.md "Switching the embedding profile"). ``GET /readyz`` reports the
    profile, ready, list version 1. A process request naming another profile is answered 409
    (else 202); a search naming another profile 422 (else 200 with ``search_results``); a
    backfill batch without the secret 401, for another profile 409, 503 with ``Retry-After``
    while ``busy_retry_after`` is set, else 200 with every context completed. Every body is
    recorded; nothing is written."""

    def __init__(self, profile: str, secret: str) -> None:
        self.profile = profile
        self.secret = secret
        self.processed: list[dict[str, Any]] = []
        self.searched: list[dict[str, Any]] = []
        self.search_results: list[dict[str, Any]] = []
        self.batches: list[dict[str, Any]] = []
        self.batch_arrived = asyncio.Event()  # set by each backfill batch received
        self.busy_retry_after: str | None = None
        self.base_url = ""
        self.app = Starlette(
            routes=[
                Route(PROCESS_PATH, self._process, methods=["POST"]),
                Route(SEARCH_PATH, self._search, methods=["POST"]),
                Route(BACKFILL_PATH, self._backfill, methods=["POST"]),
                Route("/readyz", self._readyz, methods=["GET"]),
            ]
        )

    def batched_context_ids(self) -> list[list[int]]:
        """The context ids of each backfill batch received, in order."""
        return [[c["contextId"] for c in batch["contexts"]] for batch in self.batches]

    async def _readyz(self, _request: Request) -> JSONResponse:
        return readyz_answer(ready=True, profile=self.profile, version=1)

    async def _process(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.processed.append(body)
        if body.get("embeddingProfile", self.profile) != self.profile:
            return JSONResponse({"detail": "another profile"}, status_code=409)
        return JSONResponse({"contextId": body["contextId"]}, status_code=202)

    async def _search(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.searched.append(body)
        if body["embeddingProfile"] != self.profile:
            return JSONResponse({"detail": "another profile"}, status_code=422)
        return JSONResponse({"results": self.search_results})

    async def _backfill(self, request: Request) -> JSONResponse:
        if request.headers.get("X-Internal-Secret") != self.secret:
            return JSONResponse({"detail": "unauthorized"}, status_code=401)
        body = await request.json()
        self.batches.append(body)
        self.batch_arrived.set()
        if body["embeddingProfile"] != self.profile:
            return JSONResponse({"detail": "another profile"}, status_code=409)
        if self.busy_retry_after is not None:
            return JSONResponse(
                {"detail": "backfill refused: busy"},
                status_code=503,
                headers={"Retry-After": self.busy_retry_after},
            )
        return JSONResponse(backfill_counts(completed=len(body["contexts"])))
