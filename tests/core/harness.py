"""A running core service for tests: the real app on real uvicorn, talking to a real worker
(or ``FakeWorker``) over HTTP, against the session database; and the core's parts that tests
drive alone: worker endpoints, the profile routing, workers of a profile (``ProfileWorker``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.composition import build_scheduler
from core_service.main import create_app
from core_service.repository import member
from core_service.repository.db import transaction
from core_service.service.member_tokens import issue_token
from core_service.service.process_requests import DispatchRequest
from core_service.service.rescan import RescanScheduler
from core_service.service.worker_endpoints import WorkerEndpoints
from core_service.service.worker_routing import ProfileRouting
from core_service.settings import CoreSettings
from tests.fake_worker import ProfileWorker
from tests.worker.harness import PROFILE, SECRET, serving

JWT_SECRET = "test-jwt-secret-0123456789abcdef0123456789"
# One process request as the core sends it.
DISPATCH_REQUEST = DispatchRequest(
    context_id=7,
    member_id=1,
    record_id=5,
    body="창가 자리 좋음",
    external_place_id="p1",
    place_name="카페",
)


def core_settings(database_url: str, worker_base_url: str, **overrides: Any) -> CoreSettings:
    values: dict[str, Any] = {
        "database_url": database_url,
        "worker_base_url": worker_base_url,
        "internal_secret": SECRET,
        "jwt_secret": JWT_SECRET,
        "embedding_profile": PROFILE,
        # An operations listener on a free loopback port (RunningCore.ops).
        "ops_port": 0,
        # Quotas off: tests of other issues send bursts on purpose.
        "member_writes_per_minute": 0,
        "member_searches_per_minute": 0,
        # §7's exact result set unless a test asks for the cuts (None: the defaults).
        "search_similarity_floor": 0,
        "search_similarity_floor_word": 0,
        "search_top_ratio": 0,
    }
    values.update(overrides)
    return CoreSettings(**values)


async def make_member(engine: AsyncEngine, member_id: int) -> None:
    async with transaction(engine) as conn:
        await member.ensure(conn, member_id)


def bearer(member_id: int, *, ttl_seconds: int = 3600) -> dict[str, str]:
    token = issue_token(member_id, secret=JWT_SECRET, ttl_seconds=ttl_seconds)
    return {"Authorization": f"Bearer {token}"}


@dataclass
class RunningCore:
    app: FastAPI
    settings: CoreSettings
    client: httpx.AsyncClient
    base_url: str
    ops: httpx.AsyncClient | None = None

    def scheduler(self) -> RescanScheduler:
        """A scheduler sharing this app's engine and dispatcher, as the loop would run it."""
        state = self.app.state
        return build_scheduler(self.settings, state.engine, state.dispatcher, state.metrics)

    async def create(
        self, member_id: int, body: str, *, place: str = "place-1", name: str = "카페"
    ):
        return await self.client.post(
            "/api/v1/records",
            json={"externalPlaceId": place, "placeName": name, "body": body},
            headers=bearer(member_id),
        )


@asynccontextmanager
async def running_core(settings: CoreSettings) -> AsyncIterator[RunningCore]:
    app = create_app(settings, run_rescan_loop=False, run_backfill_loop=False)
    async with serving(app) as base_url, httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        ops_url = app.state.ops_base_url
        if ops_url is None:
            yield RunningCore(app, settings, client, base_url)
            return
        async with httpx.AsyncClient(base_url=ops_url, timeout=30) as ops:
            yield RunningCore(app, settings, client, base_url, ops)


@asynccontextmanager
async def endpoints_of(*base_urls: str) -> AsyncIterator[WorkerEndpoints]:
    """The core's ``WorkerEndpoints`` of these workers (1 s to connect, 5 s to read), closed
    afterwards."""
    endpoints = WorkerEndpoints.connect(
        base_urls, internal_secret=SECRET, connect_timeout_seconds=1.0, read_timeout_seconds=5.0
    )
    try:
        yield endpoints
    finally:
        await endpoints.aclose()


@asynccontextmanager
async def profile_routing(
    endpoints: WorkerEndpoints, **gauges: Any
) -> AsyncIterator[ProfileRouting]:
    """A ``ProfileRouting`` whose refreshes the caller drives; closed as the core closes it
    (its loop, stopped). ``gauges``: its ``metrics`` and ``profile_in_use``, when given."""
    routing = ProfileRouting(endpoints, **gauges)
    try:
        yield routing
    finally:
        stopped = asyncio.Event()
        stopped.set()
        await routing.run_forever(stopped)


@asynccontextmanager
async def profile_workers(*profiles: str) -> AsyncIterator[list[ProfileWorker]]:
    """One ``ProfileWorker`` per profile, in order, each served on its own loopback port."""
    workers = [ProfileWorker(profile, SECRET) for profile in profiles]
    async with AsyncExitStack() as stack:
        for worker in workers:
            worker.base_url = await stack.enter_async_context(serving(worker.app))
        yield workers
