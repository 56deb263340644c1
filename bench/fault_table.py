"""Measures infrastructure faults (silent database, read-only server, slow clients) against a
running core (real uvicorn, real PostgreSQL through a fault-injecting TCP proxy) and prints one
line per fault: status, time to answer, recovery time. Runs on any revision with
``tests/fault_proxy.py`` copied in:

    cp bench/fault_table.py tests/core/test_zz_faults.py
    .venv/bin/python -m pytest -q -s -p no:cacheprovider tests/core/test_zz_faults.py

Each wait is capped at ``CAP`` seconds ("no answer" past it).
"""

from __future__ import annotations

import asyncio
import time

import httpx
from sqlalchemy import text

from tests.core.harness import bearer, core_settings, running_core
from tests.fault_proxy import fault_proxy, set_read_only

CAP = 20.0
NOTE = {"externalPlaceId": "p", "placeName": "카페", "body": "메모"}


async def _timed(coro) -> tuple[str, float]:
    started = time.monotonic()
    try:
        response = await asyncio.wait_for(coro, CAP)
        status = str(response.status_code)
    except TimeoutError:
        status = "no answer"
    except httpx.HTTPError as exc:
        status = type(exc).__name__
    return status, time.monotonic() - started


def _line(fault: str, status: str, seconds: float, recovery: str = "") -> None:
    print(f"| {fault} | {status} | {seconds:.2f} s | {recovery} |", flush=True)


async def _recovery(core) -> str:
    started = time.monotonic()
    while time.monotonic() - started < CAP:
        try:
            response = await core.client.post("/api/v1/records", json=NOTE, headers=bearer(2))
            if response.status_code in (200, 201):
                return f"{time.monotonic() - started:.2f} s"
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.2)
    return f"> {CAP:.0f} s"


async def test_fault_table(members, fake_worker, migrated_database, engine):
    print()
    async with (
        fault_proxy(migrated_database) as proxy,
        running_core(core_settings(proxy.url, fake_worker.base_url)) as core,
    ):
        await core.client.post("/api/v1/records", json=NOTE, headers=bearer(1))
        proxy.freeze()
        status, seconds = await _timed(
            core.client.post("/api/v1/records", json=NOTE, headers=bearer(1), timeout=CAP)
        )
        ready, ready_seconds = await _timed(core.client.get("/readyz", timeout=CAP))
        proxy.thaw()
        _line("silent database: core create", status, seconds, await _recovery(core))
        _line("silent database: core /readyz", ready, ready_seconds)

    async with running_core(core_settings(migrated_database, fake_worker.base_url)) as core:
        await core.client.post("/api/v1/records", json=NOTE, headers=bearer(1))
        await set_read_only(engine, read_only=True)
        async with engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = 'pinlog-core'"
                )
            )
        statuses = []
        started = time.monotonic()
        for _ in range(5):
            response = await core.client.post("/api/v1/records", json=NOTE, headers=bearer(1))
            statuses.append(response.status_code)
        seconds = (time.monotonic() - started) / 5
        ready = (await core.client.get("/readyz")).status_code
        await set_read_only(engine, read_only=False)
        recovery = await _recovery(core)
        _line(
            "read-only database: core create (5x)", ",".join(map(str, statuses)), seconds, recovery
        )
        _line("read-only database: core /readyz", str(ready), 0.0)

    # 200 trickling connections, then one normal request; served as `pinlog-core serve` does.
    from core_service.main import create_app
    from tests.worker.harness import serving

    settings = core_settings(migrated_database, fake_worker.base_url)
    try:
        from pinlog_platform.http.server import uvicorn_options

        options = uvicorn_options(settings)
    except (
        ImportError
    ):  # a checkout without the serving limits: uvicorn's defaults, keep-alive 30 s
        options = {}
    app = create_app(settings, run_rescan_loop=False)
    async with serving(app, **options) as base_url, httpx.AsyncClient(base_url=base_url) as c:
        status, seconds = await _timed(c.get("/healthz", headers={"X-Big": "a" * 2**20}))
        _line("1 MiB request header (/healthz)", status, seconds)
        port = int(base_url.rsplit(":", 1)[1])
        tricklers = [await asyncio.open_connection("127.0.0.1", port) for _ in range(200)]
        for _, writer in tricklers:
            writer.write(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
        status, seconds = await _timed(c.get("/healthz"))
        _line("200 trickling connections: a normal request", status, seconds)
        await asyncio.sleep(11)
        still_open = 0
        for reader, _ in tricklers:
            try:
                await asyncio.wait_for(reader.read(100), 0.01)
            except TimeoutError:
                still_open += 1
        for _, writer in tricklers:
            writer.close()
        _line("200 trickling connections: still open after 11 s", str(still_open), 0.0)
