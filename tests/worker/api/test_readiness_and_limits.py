"""Readiness within 1 s in every state, and the request body cap (§8).

Real parts only: a worker whose pool is exhausted behind row locks held by another session,
a local TCP listener that accepts and never answers (a database host that hangs), a closed
port (a database that is down), and raw sockets that announce a body and never send it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator

from sqlalchemy import text

from app.repository.db import create_engine
from app.service.health import DATABASE_SLOW, DATABASE_UNAVAILABLE, Readiness
from app.service.presets import PresetCache
from tests.worker.harness import PROCESS_PATH, PROFILE, SECRET
from tests.worker.support import count_rows, make_state

NOTE = "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음."
LOCK_STATE_ROWS = text("SELECT 1 FROM ai.context_ai_state WHERE context_id IN (1, 2) FOR UPDATE")
LOCK_WAITERS = text(
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
)
READY_WITHIN_SECONDS = 1.0


async def _timed_readyz(client) -> tuple[float, int]:
    started = time.monotonic()
    response = await client.get("/readyz")
    return time.monotonic() - started, response.status_code


async def test_readyz_answers_within_1s_while_the_pool_is_exhausted_behind_row_locks(
    engine, make_worker
):
    """Pool of 1 for 2 worker tasks; both contexts' state rows locked elsewhere: one task
    holds the only pooled connection waiting on the lock, the other waits for the pool.
    ``/readyz`` uses its own connection and answers 200 at once."""
    await make_state(engine, context_id=1)
    await make_state(engine, context_id=2)
    async with (
        make_worker(database_pool_size=1, worker_concurrency=2) as worker,
        engine.connect() as blocker,
    ):
        transaction = await blocker.begin()
        await blocker.execute(LOCK_STATE_ROWS)
        try:
            for context_id in (1, 2):
                body = {"contextId": context_id, "userId": 1, "recordId": 1, "text": NOTE}
                assert (await worker.post(body)).status_code == 202
            async with asyncio.timeout(5):
                # A lock wait is visible only in pg_stat_activity: poll it, bounded.
                while (await blocker.execute(LOCK_WAITERS)).scalar_one() == 0:  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
            timings = [await _timed_readyz(worker.client) for _ in range(3)]
        finally:
            await transaction.rollback()
        await worker.drain()

    assert all(status == 200 for _, status in timings), timings
    assert max(elapsed for elapsed, _ in timings) < READY_WITHIN_SECONDS, timings


@contextlib.asynccontextmanager
async def _silent_listener() -> AsyncIterator[int]:
    """A TCP port that accepts connections and never says a word (a hung database host)."""
    held: list[asyncio.StreamWriter] = []

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def _problems_for(port: int) -> tuple[float, list[str]]:
    probe_engine = create_engine(
        f"postgresql+asyncpg://worker@127.0.0.1:{port}/pinlog", pool_size=1
    )
    readiness = Readiness(probe_engine, PresetCache(probe_engine, PROFILE), {}, profile=PROFILE)
    try:
        started = time.monotonic()
        problems = await readiness.problems()
        return time.monotonic() - started, problems
    finally:
        await readiness.aclose()
        await probe_engine.dispose()


async def test_readiness_of_a_database_that_never_answers_is_reported_within_1s():
    async with _silent_listener() as port:
        elapsed, problems = await _problems_for(port)

    assert problems == [DATABASE_SLOW, "presets not loaded"]
    assert elapsed < READY_WITHIN_SECONDS


async def test_readiness_of_a_database_that_is_down_is_reported_within_1s():
    elapsed, problems = await _problems_for(_closed_port())

    assert problems == [DATABASE_UNAVAILABLE, "presets not loaded"]
    assert elapsed < READY_WITHIN_SECONDS


# ----------------------------------------------------------------------------- body cap


async def _raw_post(port: int, headers: dict[str, str], body: bytes) -> bytes:
    """Send a request head (and ``body``, possibly far short of what it announces) on a raw
    socket; return the response status line without sending anything more."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        head = f"POST {PROCESS_PATH} HTTP/1.1\r\nHost: worker\r\n"
        head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        writer.write(head.encode() + b"\r\n" + body)
        await writer.drain()
        async with asyncio.timeout(5):
            return await reader.readline()
    finally:
        writer.close()


def _port(worker) -> int:
    return int(str(worker.client.base_url).rsplit(":", 1)[1].rstrip("/"))


async def test_a_declared_10_mb_body_is_413_before_it_is_sent(engine, worker, fake_openai):
    """The head announces 10 MB and 1 KiB follows: 413 comes back at once, nothing queued."""
    await make_state(engine, context_id=1)
    headers = {
        "X-Internal-Secret": SECRET,
        "Content-Type": "application/json",
        "Content-Length": str(10 * 1024 * 1024),
    }

    status_line = await _raw_post(_port(worker), headers, b"{" + b" " * 1023)

    assert status_line.startswith(b"HTTP/1.1 413")
    await worker.drain()
    assert fake_openai.embedding_calls == 0
    assert await count_rows(engine, "ai.context_embedding", 1) == 0


async def test_a_chunked_body_is_cut_off_with_413_once_it_passes_the_cap(
    engine, worker, fake_openai
):
    """No Content-Length: the body is counted as it arrives; 200 KiB of a 64 KiB cap."""
    await make_state(engine, context_id=1)
    body = {"contextId": 1, "userId": 1, "recordId": 1, "text": "가" * 70_000}

    async def chunks() -> AsyncIterator[bytes]:
        encoded = json.dumps(body, ensure_ascii=False).encode()
        for start in range(0, len(encoded), 8192):
            yield encoded[start : start + 8192]

    response = await worker.client.post(
        PROCESS_PATH,
        content=chunks(),
        headers={"X-Internal-Secret": SECRET, "Content-Type": "application/json"},
    )

    assert response.status_code == 413
    assert response.json() == {"detail": "request body too large"}
    await worker.drain()
    assert fake_openai.embedding_calls == 0


async def test_a_body_at_the_cap_is_accepted_and_an_unauthenticated_big_one_is_401(engine, worker):
    await make_state(engine, context_id=1)
    envelope = json.dumps({"contextId": 1, "userId": 1, "recordId": 1, "text": ""})
    filler = "a" * (worker.settings.max_request_bytes - len(envelope))
    at_cap = envelope.replace('"text": ""', f'"text": "{filler}"').encode()
    assert len(at_cap) == worker.settings.max_request_bytes

    accepted = await worker.client.post(
        PROCESS_PATH,
        content=at_cap,
        headers={"X-Internal-Secret": SECRET, "Content-Type": "application/json"},
    )
    unauthenticated = await worker.client.post(PROCESS_PATH, content=at_cap + b" " * 100_000)

    assert accepted.status_code == 202
    assert unauthenticated.status_code == 401  # the secret is checked before the size (§8)
    await worker.drain()
