"""The core's operations listener: ``/metrics`` and the detailed ``/readyz``
on their own port, never on the public one.

No operations listener runs unless ``PINLOG_CORE_OPS_PORT`` (or ``pinlog-core serve
--ops-port``) is set; it binds ``PINLOG_CORE_OPS_HOST`` (``--ops-host``), loopback by default.
The public port keeps ``/healthz`` and a ``/readyz`` that says only ready or not. The listener
is a second uvicorn server in the same process and event loop, started and stopped by the
public app's lifespan; it never takes the process's signal handlers (the public server owns
SIGTERM and stops it on the way out).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator

import uvicorn
from fastapi import FastAPI, Request
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from pinlog_platform.db.engines import ACCEPTS_WRITES as ACCEPTS_WRITES_SQL
from pinlog_platform.http.json_response import OrjsonResponse
from pinlog_platform.http.probes import liveness, metrics

READINESS_TIMEOUT_SECONDS = 1.0
ACCEPTS_WRITES = text(ACCEPTS_WRITES_SQL)


async def readiness_problems(probe_engine: AsyncEngine) -> list[str]:
    """What keeps the core from serving: ``["database"]`` unless it answers within 1 s and
    accepts writes (not while the server is read-only, e.g. a standby after a failover)."""
    try:
        async with asyncio.timeout(READINESS_TIMEOUT_SECONDS):
            async with probe_engine.connect() as conn:
                writable = (await conn.execute(ACCEPTS_WRITES)).scalar()
    except Exception:
        writable = False
    return [] if writable else ["database"]


def bind_ops_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``; ``OSError`` when it cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def create_ops_app(public: FastAPI) -> FastAPI:
    """``/healthz``, ``/metrics`` (the public app's registry; ``pinlog_core_database_up`` set
    by a readiness check at each scrape) and ``/readyz`` with the names of the problems,
    reading the public app's state (published by its lifespan)."""
    ops = FastAPI(title="PinLog core operations", docs_url=None, redoc_url=None, openapi_url=None)
    ops.state.metrics_registry = public.state.metrics_registry

    async def before_scrape() -> None:
        # pinlog_core_database_up: the readiness check, bounded at 1 s like /readyz.
        problems = await readiness_problems(public.state.probe_engine)
        public.state.metrics.database_up.set(0 if problems else 1)

    ops.state.before_scrape = before_scrape
    ops.include_router(liveness)
    ops.include_router(metrics)

    @ops.get("/readyz")
    async def readyz(_request: Request) -> OrjsonResponse:
        """Readiness with its reasons: ``{"status": "unavailable", "problems": [...]}``, or
        ``{"status": "ready", "dispatch": "paused" | "running"}``: a pause keeps 200, so that
        it never takes the client API out of a load balancer."""
        problems = await readiness_problems(public.state.probe_engine)
        if problems:
            return OrjsonResponse({"status": "unavailable", "problems": problems}, status_code=503)
        paused = await public.state.pause.paused()
        return OrjsonResponse({"status": "ready", "dispatch": "paused" if paused else "running"})

    return ops


class _OpsServer(uvicorn.Server):
    """A uvicorn server that leaves the process's signal handlers to the public server."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def serving_ops(public: FastAPI, sock: socket.socket | None) -> AsyncIterator[str | None]:
    """Serve ``create_ops_app(public)`` on ``sock`` until the block ends; yields its base URL
    (``None`` and nothing served when ``sock`` is ``None``)."""
    if sock is None:
        yield None
        return
    config = uvicorn.Config(
        create_ops_app(public), log_config=None, access_log=False, lifespan="off"
    )
    server = _OpsServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                await task
                raise RuntimeError("operations listener did not start")
            await asyncio.sleep(0.01)
        host, port = sock.getsockname()[:2]
        yield f"http://{host}:{port}" if ":" not in host else f"http://[{host}]:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()
