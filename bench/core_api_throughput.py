"""Benchmark: what one core-service process sustains on the client API, alone.

Embedded PostgreSQL (or ``PINLOG_CORE_DATABASE_URL``), every migration, the core service as its
own ``pinlog-core serve`` process, and a minimal stand-in worker that accepts every dispatch
(so the worker's cost is not measured). Creates, edits and reads through the API with member
tokens; prints requests per second, latency percentiles and the core process's CPU per request.
Asserts nothing.

    .venv/bin/python -m bench.core_api_throughput --requests 600 --concurrency 16

``--otlp-endpoint URL`` runs the core with traces exported there
(``PINLOG_CORE_OTEL_EXPORTER_OTLP_ENDPOINT``; sampling by ``OTEL_TRACES_SAMPLER`` /
``OTEL_TRACES_SAMPLER_ARG`` of this environment, default 10 %): the cost of tracing is the
difference to a run without it (docs/operations.md "Traces").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from app import embedded_postgres
from core_service.repository import member
from core_service.repository.db import create_engine, transaction
from core_service.service.member_tokens import issue_token
from pinlog_platform.contract import schema as migrations

# Throwaway secrets of this run.
SECRET = secrets.token_urlsafe(24)
JWT_SECRET = secrets.token_urlsafe(48)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def _accept(request: Request) -> JSONResponse:
    body = await request.json()
    return JSONResponse({"contextId": body["contextId"]}, status_code=202)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run(requests: int, concurrency: int, otlp_endpoint: str | None = None) -> None:
    database_url = os.environ.get("PINLOG_CORE_DATABASE_URL") or embedded_postgres.start(
        Path(tempfile.mkdtemp(prefix="pinlog-bench-core-")) / "pg", delete_on_exit=True
    )
    engine = create_engine(database_url, pool_size=2)
    await migrations.upgrade(engine)
    members = range(1, 9)
    async with transaction(engine) as conn:
        for member_id in members:
            await member.ensure(conn, member_id)
    await engine.dispose()

    worker_port, core_port = _free_port(), _free_port()
    stand_in = uvicorn.Server(
        uvicorn.Config(
            Starlette(routes=[Route("/internal/v1/context/process", _accept, methods=["POST"])]),
            port=worker_port,
            log_config=None,
            access_log=False,
        )
    )
    stand_in_task = asyncio.create_task(stand_in.serve())
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PINLOG_")},
        "PINLOG_CORE_DATABASE_URL": database_url,
        "PINLOG_CORE_WORKER_BASE_URL": f"http://127.0.0.1:{worker_port}",
        "PINLOG_CORE_INTERNAL_SECRET": SECRET,
        "PINLOG_CORE_JWT_SECRET": JWT_SECRET,
        "PINLOG_CORE_EMBEDDING_PROFILE": "local-use-multilingual-v3-512-cosine-v1",
        "PINLOG_CORE_LOG_LEVEL": "WARNING",
        # The benchmark measures the API, not the member quotas.
        "PINLOG_CORE_MEMBER_WRITES_PER_MINUTE": "0",
        "PINLOG_CORE_MEMBER_SEARCHES_PER_MINUTE": "0",
    }
    if otlp_endpoint:
        env["PINLOG_CORE_OTEL_EXPORTER_OTLP_ENDPOINT"] = otlp_endpoint
    core = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "core_service.cli", "serve", "--port", str(core_port), "--no-rescan",
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    base = f"http://127.0.0.1:{core_port}"
    headers = {
        m: {"Authorization": f"Bearer {issue_token(m, secret=JWT_SECRET, ttl_seconds=3600)}"}
        for m in members
    }
    try:
        # aiohttp: the driver's CPU per request (httpx costs ~2 ms) must stay small beside the
        # core's on a 2-core machine.
        connector = aiohttp.TCPConnector(limit=concurrency)
        timeout = aiohttp.ClientTimeout(total=30)
        async with aiohttp.ClientSession(base, connector=connector, timeout=timeout) as client:
            while True:
                try:
                    async with client.get("/readyz") as ready:
                        if ready.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
            created: list[tuple[int, int, int]] = []  # (member, record, context) per create
            for kind in ("create", "edit", "read"):
                await _phase(client, kind, requests, concurrency, headers, core.pid, created)
    finally:
        core.terminate()
        await core.wait()
        stand_in.should_exit = True
        await stand_in_task


async def _phase(client, kind, requests, concurrency, headers, pid, created) -> None:
    latencies: list[float] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(requests):
        queue.put_nowait(n)

    async def one(n: int) -> None:
        member_id = 1 + n % 8
        began = time.perf_counter()
        if kind == "create":
            status, body = await _call(
                client.post(
                    "/api/v1/records",
                    json={
                        "externalPlaceId": f"p{n % 50}",
                        "placeName": "카페",
                        "body": f"메모 {n} 조용한 카페",
                    },
                    headers=headers[member_id],
                )
            )
            created.append((member_id, body["recordId"], body["contextId"]))
        elif kind == "edit":
            owner, _record, context_id = created[n % len(created)]
            status, body = await _call(
                client.put(
                    f"/api/v1/contexts/{context_id}",
                    json={"body": f"고친 메모 {n}"},
                    headers=headers[owner],
                )
            )
            if status == 200:
                created[n % len(created)] = (owner, _record, body["contextId"])
        else:
            owner, record_id, _context = created[n % len(created)]
            status, body = await _call(
                client.get(f"/api/v1/records/{record_id}", headers=headers[owner])
            )
        assert status < 500, body
        latencies.append(time.perf_counter() - began)

    async def worker() -> None:
        while not queue.empty():
            await one(queue.get_nowait())

    cpu_before, started = _cpu_seconds(pid), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed, cpu = time.perf_counter() - started, _cpu_seconds(pid) - cpu_before
    latencies.sort()
    p50, p99 = statistics.median(latencies), latencies[int(len(latencies) * 0.99) - 1]
    print(
        f"{kind:6}: {requests / elapsed:7.1f} requests/s, p50 {p50 * 1000:6.1f} ms, "
        f"p99 {p99 * 1000:6.1f} ms, "
        f"core CPU {cpu / requests * 1000:5.2f} ms/request (concurrency {concurrency})"
    )


async def _call(request) -> tuple[int, dict]:
    async with request as response:
        return response.status, await response.json()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--otlp-endpoint", default=None, help="export the core's traces here")
    args = parser.parse_args()
    asyncio.run(run(args.requests, args.concurrency, args.otlp_endpoint))


if __name__ == "__main__":
    main()
