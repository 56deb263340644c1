"""Clients that do not finish a request are cut off, on both services' HTTP stack
(``pinlog_platform.http.server``): a head larger than ``max_header_bytes`` answers 431 without
being read whole, a head not complete within ``head_timeout`` answers 408 and the connection
closes, normal requests keep being served meanwhile, and beyond ``limit_concurrency`` a
request answers 503 at once. Real uvicorn on real sockets, serving the worker's and the core's
own app (no lifespan: the limits sit below the app). 1,000 trickling connections per service
are in ``bench/``; a few hundred here prove the point."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.main import create_app as create_worker_app
from core_service.main import create_app as create_core_app
from pinlog_platform.http.server import uvicorn_options
from pinlog_platform.settings_rules.http_serving import HttpServingSettings
from tests.core.harness import core_settings
from tests.worker.harness import SECRET, serving, worker_settings

# Head timeouts and a concurrency limit measured against the clock: alone, in the serial pass.
pytestmark = pytest.mark.serial

TRICKLERS = 200
HEAD_TIMEOUT = 2.0
MAX_HEADER_BYTES = 8192


@pytest.fixture(params=["worker", "core"])
def app(request, fake_openai_server):
    url = "postgresql+asyncpg://nobody@127.0.0.1:9/none"  # never reached: no lifespan
    if request.param == "worker":
        return create_worker_app(worker_settings(url, fake_openai_server))
    return create_core_app(core_settings(url, "http://127.0.0.1:9"), run_rescan_loop=False)


def _options(**overrides):
    values = {
        "limit_concurrency": 900,
        "max_header_bytes": MAX_HEADER_BYTES,
        "head_timeout": HEAD_TIMEOUT,
        "timeout_keep_alive": 5,
    }
    values.update(overrides)
    return {**uvicorn_options(HttpServingSettings(**values)), "lifespan": "off"}


async def _get_healthz(port: int) -> tuple[bytes, float]:
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return answer.split(b"\r\n", 1)[0], time.monotonic() - started


def _port(base_url: str) -> int:
    return int(base_url.rsplit(":", 1)[1])


async def test_trickling_clients_are_cut_at_the_head_timeout_and_others_are_served(app):
    async with serving(app, **_options()) as base_url:
        port = _port(base_url)
        tricklers = [await asyncio.open_connection("127.0.0.1", port) for _ in range(TRICKLERS)]
        for _, writer in tricklers:
            writer.write(b"GET /healthz HTTP/1.1\r\nX-Slow: ")
        # Normal requests are served while every trickler holds its socket.
        for _ in range(3):
            status, elapsed = await _get_healthz(port)
            assert status == b"HTTP/1.1 200 OK" and elapsed < 0.5
            for _, writer in tricklers:
                writer.write(b"a")
            await asyncio.sleep(0.05)
        # The head deadline ends each of them with 408, then the server closes.
        answers = await asyncio.wait_for(
            asyncio.gather(*(reader.read() for reader, _ in tricklers)), HEAD_TIMEOUT + 5
        )
        assert {answer.split(b"\r\n", 1)[0] for answer in answers} == {
            b"HTTP/1.1 408 Request Timeout"
        }
        for _, writer in tricklers:
            writer.close()


async def test_a_head_over_the_limit_answers_431_without_being_read_whole(app):
    async with serving(app, **_options()) as base_url:
        reader, writer = await asyncio.open_connection("127.0.0.1", _port(base_url))
        answer = asyncio.create_task(reader.read(100))
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Big: ")
        sent = 0
        try:
            for _ in range(1024):  # up to 64 MiB, unless the server closes first
                writer.write(b"a" * 65536)
                await writer.drain()
                sent += 65536
        except ConnectionError:
            pass
        # The 431 arrives first; the close that follows may reset the connection (unread
        # bytes on the server's side), never before the server stopped reading.
        assert (await asyncio.wait_for(answer, 5)).startswith(b"HTTP/1.1 431 ")
        assert sent < 8 * 1024 * 1024, "the server read far more than its limit"
        writer.close()
        status, _ = await _get_healthz(_port(base_url))
        assert status == b"HTTP/1.1 200 OK"


async def test_beyond_the_concurrency_limit_a_request_answers_503_at_once(app):
    async with serving(app, **_options(limit_concurrency=10)) as base_url:
        port = _port(base_url)
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(12)]
        status, elapsed = await _get_healthz(port)
        assert status == b"HTTP/1.1 503 Service Unavailable" and elapsed < 1.0
        for _, writer in idle:
            writer.close()
        await asyncio.sleep(0.2)
        status, _ = await _get_healthz(port)
        assert status == b"HTTP/1.1 200 OK"


def test_the_four_options_exist_on_both_clis():
    import typer.main

    from app.cli import app as ai_cli
    from core_service.cli import app as core_cli

    for cli in (ai_cli, core_cli):
        serve = typer.main.get_command(cli).commands["serve"]
        flags = {flag for param in serve.params for flag in param.opts}
        assert {
            "--limit-concurrency",
            "--max-header-bytes",
            "--head-timeout",
            "--timeout-keep-alive",
        } <= flags
    assert SECRET
