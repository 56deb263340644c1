"""Fixtures of the two-service tests: a worker process and a core process per test module,
and a client of the core's API acting as members 1 and 2.

The processes outlive single tests (starting one costs seconds); the per-test TRUNCATE of the
root conftest empties the tables under them, and the ``presets`` fixture puts back the same
preset rows (same ids) the worker cached when it started.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from app.repository import keyword_preset
from tests.core.harness import bearer, make_member
from tests.e2e.processes import ServiceProcess, core_environment, worker_environment

OWNER, OTHER = 1, 2


@dataclass
class Services:
    """The two running services; ``core_env`` is also what ``pinlog-core`` commands get."""

    worker: ServiceProcess
    core: ServiceProcess
    core_env: dict[str, str]

    def command_env(self, **overrides: Any) -> dict[str, str]:
        """The core's settings with overrides, for ``pinlog-core`` subprocesses."""
        database_url = self.core_env["PINLOG_CORE_DATABASE_URL"]
        return core_environment(database_url, self.worker.base_url, **overrides)


@pytest.fixture(scope="module")
async def services(
    engine, migrated_database, bundled_preset_rows, fake_openai_server, tmp_path_factory
) -> AsyncIterator[Services]:
    """``pinlog-ai serve`` (fake OpenAI) and ``pinlog-core serve --no-rescan`` (rescans run as
    ``pinlog-core rescan --once`` where a test wants one), both real processes."""
    async with engine.begin() as conn:  # the worker caches presets at startup (§4)
        await keyword_preset.upsert_all(conn, bundled_preset_rows)
    logs = tmp_path_factory.mktemp("e2e-logs")
    worker = ServiceProcess(
        "app", worker_environment(migrated_database, fake_openai_server), logs / "worker.log"
    )
    core_env = core_environment(migrated_database, worker.base_url)
    core = ServiceProcess("core_service", core_env, logs / "core.log", extra_args=("--no-rescan",))
    try:
        await asyncio.gather(worker.start(), core.start())
        yield Services(worker, core, core_env)
    finally:
        await asyncio.gather(core.stop(), worker.stop())


@pytest.fixture
async def live(services: Services, engine, presets, fake_openai) -> Services:
    """The services with the worker running (restarted if an earlier test stopped it)."""
    if not services.worker.running:
        await services.worker.start()
    return services


class CoreApi:
    """The core's client API over HTTP, as a member (``as_member``) would call it."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def create(
        self, body: str, *, member: int = OWNER, place: str = "place-1", name: str = "카페"
    ) -> httpx.Response:
        return await self.client.post(
            "/api/v1/records",
            json={"externalPlaceId": place, "placeName": name, "body": body},
            headers=bearer(member),
        )

    async def add(self, record_id: int, body: str, *, member: int = OWNER) -> httpx.Response:
        return await self.client.post(
            f"/api/v1/records/{record_id}/contexts", json={"body": body}, headers=bearer(member)
        )

    async def modify(self, context_id: int, body: str, *, member: int = OWNER) -> httpx.Response:
        return await self.client.put(
            f"/api/v1/contexts/{context_id}", json={"body": body}, headers=bearer(member)
        )

    async def delete_context(self, context_id: int, *, member: int = OWNER) -> httpx.Response:
        return await self.client.delete(f"/api/v1/contexts/{context_id}", headers=bearer(member))

    async def delete_record(self, record_id: int, *, member: int = OWNER) -> httpx.Response:
        return await self.client.delete(f"/api/v1/records/{record_id}", headers=bearer(member))

    async def read(self, record_id: int, *, member: int = OWNER) -> httpx.Response:
        return await self.client.get(f"/api/v1/records/{record_id}", headers=bearer(member))

    async def read_public(self, public_id: str, *, member: int = OWNER) -> httpx.Response:
        return await self.client.get(f"/api/v1/public-records/{public_id}", headers=bearer(member))

    async def created(self, body: str, **kwargs: Any) -> tuple[int, int]:
        """Create and require 201/200; ``(record_id, context_id)``."""
        response = await self.create(body, **kwargs)
        assert response.status_code in (200, 201), response.text
        return response.json()["recordId"], response.json()["contextId"]


@pytest.fixture
async def api(services: Services, engine) -> AsyncIterator[CoreApi]:
    """A client of the running core; members 1 and 2 exist (tables are emptied per test)."""
    for member_id in (OWNER, OTHER):
        await make_member(engine, member_id)
    async with httpx.AsyncClient(base_url=services.core.base_url, timeout=30) as client:
        yield CoreApi(client)
