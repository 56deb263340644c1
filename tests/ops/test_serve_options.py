"""``pinlog-ai serve`` passes the operators' uvicorn settings through (a real process).

The keep-alive default outlives the core client's 2 s idle expiry, so the server is never the
side closing a connection a client is about to reuse; a short explicit value is honoured.
"""

from __future__ import annotations

import asyncio
import http.client
import os
import socket
import sys
import time

import pytest
import typer.main

from app.cli import app as ai_cli
from app.settings import Settings
from tests.worker.harness import SECRET

CORE_CLIENT_IDLE_SECONDS = 2.0  # KEEPALIVE_EXPIRY_SECONDS of core_service.service.worker_endpoints


def test_keep_alive_default_outlives_the_core_clients_idle_expiry() -> None:
    serve = typer.main.get_command(ai_cli).commands["serve"]
    defaults = {p.name: p.default for p in serve.params}
    # The option falls back to PINLOG_TIMEOUT_KEEP_ALIVE.
    assert defaults["timeout_keep_alive"] is None
    keep_alive = Settings.model_fields["timeout_keep_alive"].default
    assert keep_alive > CORE_CLIENT_IDLE_SECONDS
    assert {"proxy_headers", "forwarded_allow_ips", "timeout_graceful_shutdown"} <= set(defaults)


def _get(connection: http.client.HTTPConnection) -> int:
    """GET /healthz on an open keep-alive connection; the status, whole body read."""
    connection.request("GET", "/healthz")
    response = connection.getresponse()
    response.read()
    return response.status


async def test_serve_honours_timeout_keep_alive(migrated_database, presets) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PINLOG_")}
    env.update(
        PINLOG_DATABASE_URL=migrated_database,
        PINLOG_INTERNAL_SECRET=SECRET,
        PINLOG_EMBEDDING_API_KEY="sk-test",
        PINLOG_JUDGE_API_KEY="sk-test",
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "app.cli", "serve", "--port", str(port),
        "--timeout-keep-alive", "1", "--timeout-graceful-shutdown", "1",
        env=env, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
                break
            except OSError:
                assert time.monotonic() < deadline and process.returncode is None
                await asyncio.sleep(0.1)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            assert await asyncio.to_thread(_get, connection) == 200
            await asyncio.sleep(1.5)
            # The server closed the idle connection after 1 s; reusing it fails.
            with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
                await asyncio.to_thread(_get, connection)
        finally:
            connection.close()
    finally:
        process.terminate()
        await process.wait()
