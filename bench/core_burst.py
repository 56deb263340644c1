"""Benchmark: a burst (or a worker outage) through the core, drained by one worker.

Embedded PostgreSQL (or ``PINLOG_CORE_DATABASE_URL``), every migration, the bundled presets,
one ``pinlog-ai serve`` process (``QUEUE_CAPACITY`` as given) and one ``pinlog-core serve``
process with its rescan loop, all as real processes. The worker's provider is the repository's
fake OpenAI server (``tests/fake_openai.py``, a real HTTP server in this process) answering
every call after a fixed latency (``--embedding-ms``, ``--judge-ms``: a real provider is slower
than the core's creates, which is what makes a burst), or the offline encoder and judge
(``--provider offline``, bound by this machine's CPU).

- ``burst`` (default): the worker's own throughput first (requests posted straight to it, its
  queue never empty), then ``--notes`` creates through the core's API with production rescan
  timings; prints the drain time beside ``notes / worker throughput``, the creates per second
  the core accepted with their latency percentiles, the notes per second completed end to end
  as a share of the worker alone, the dispatches sent, refused and held, the rescan's claims,
  ``FAILED`` notes and retries spent. Search through the client API (``POST /api/v1/search``)
  of a member with ``--search-notes`` completed notes: p50/p99 over ``--searches`` sequential
  searches before the burst (idle), and over searches sent open loop at ``--search-rate`` per
  second while the burst drains (each search its own request; answers other than 200 counted
  by status).
- ``outage``: the worker stopped, ``--notes`` creates, four retry windows of shortened timings
  (rescan period and pending expiry ``--window`` seconds each), the worker started again;
  prints ``FAILED`` notes, retries spent, the drain time after the restart, dispatches sent.

Asserts nothing. Runs against whatever code is importable, so the same script measures the
code before a change (``PYTHONPATH=<old tree>``).

    .venv/bin/python -m bench.core_burst --notes 2000 --queue 100 --judge-ms 100
    .venv/bin/python -m bench.core_burst --scenario outage --notes 60 --window 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import socket
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import httpx
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app import embedded_postgres
from core_service.repository import member
from core_service.repository.db import create_engine, transaction
from core_service.service.member_tokens import issue_token
from pinlog_platform.contract import schema as migrations
from tests.e2e.processes import worker_environment
from tests.fake_openai import FakeOpenAI, Scripted
from tests.worker.harness import PROFILE

SECRET = secrets.token_urlsafe(24)
JWT_SECRET = secrets.token_urlsafe(48)
MEMBERS = range(1, 9)
SEARCH_MEMBER = 9  # its own notes, searched before and during the burst
SEARCH_QUERIES = (
    "조용한 카페", "디저트 맛집", "혼자 공부하기 좋은 곳", "친구와 브런치", "quiet cafe",
    "주차 편한 식당", "야경이 좋은", "아이와 함께", "비 오는 날", "노트북 작업",
)  # fmt: skip
# State rows of the worker-alone phase: ids far above the core's, an owner of their own.
DIRECT_FIRST_ID, DIRECT_OWNER = 50_000_000, 99
NOTE = "{i}번 메모: 창가 자리 조용하고 콘센트 많은 카페, 노트북 작업하기 좋아요"
# The searched member's notes: varied, so that searches find some and not others.
SEARCH_NOTES = (
    "{i}번: 디저트가 맛있는 조용한 카페, 혼자 공부하기 좋음",
    "{i}번: 친구와 브런치, 테라스 자리가 넓고 주차 편함",
    "{i}번: 야경이 좋은 루프탑 바, 비 오는 날에도 분위기 좋음",
    "{i}번: 아이와 함께 가기 좋은 식당, 놀이방 있음",
    "{i}번: quiet cafe with fast wifi, good for laptop work",
)


def _note(tag: str, i: int) -> str:
    if tag == "search-seed":
        return SEARCH_NOTES[i % len(SEARCH_NOTES)].format(i=i)
    return NOTE.format(i=i)


UNFINISHED = (
    "(embedding_status IN ('PENDING', 'PROCESSING') OR keyword_status IN ('PENDING', 'PROCESSING'))"
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _environment(**values: object) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("PINLOG_")}
    return base | {k: str(v) for k, v in values.items()}


class Process:
    """``python -m <package>.cli serve`` on a fixed port; can be stopped and started again."""

    def __init__(self, package: str, env: dict[str, str], *extra: str) -> None:
        self.package, self.env, self.extra = package, env, extra
        self.port = _free_port()
        self.process: asyncio.subprocess.Process | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", f"{self.package}.cli", "serve", "--port", str(self.port),
            *self.extra, env=self.env,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        async with httpx.AsyncClient(base_url=self.base_url, timeout=2) as client:
            for _ in range(1200):
                if self.process.returncode is not None:
                    raise RuntimeError(f"{self.package} exited early")
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get("/readyz")).status_code == 200:
                        return
                await asyncio.sleep(0.1)
        raise RuntimeError(f"{self.package} never became ready")

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            await self.process.wait()


async def _count(engine: AsyncEngine, sql: str, **params: object) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(text(sql), params)).scalar_one())


async def _metrics(base_url: str) -> dict[tuple[str, tuple], float]:
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
        body = (await client.get("/metrics")).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


def _sum(metrics: dict, name: str, **labels: str) -> float:
    return sum(
        value
        for (sample, sample_labels), value in metrics.items()
        if sample == name and all(dict(sample_labels).get(k) == v for k, v in labels.items())
    )


async def _wait_finished(engine: AsyncEngine, where: str, limit_seconds: float) -> float:
    """Seconds until no matching row has an unfinished stage; at most ``limit_seconds`` (then
    it says how many are still waiting and returns)."""
    started = time.monotonic()
    sql = f"SELECT count(*) FROM ai.context_ai_state WHERE {where} AND {UNFINISHED}"  # noqa: S608
    waiting = await _count(engine, sql)
    while waiting and time.monotonic() - started < limit_seconds:
        await asyncio.sleep(0.25)  # another process's rows: nothing to await
        waiting = await _count(engine, sql)
    if waiting:
        print(f"still waiting after {limit_seconds:g} s: {waiting}")
    return time.monotonic() - started


async def _creates(
    base_url: str, notes: int, concurrency: int, tag: str
) -> tuple[float, list[float]]:
    """``notes`` creates through the core's API: the seconds they took, and each one's latency
    (seconds). aiohttp: the driver's own CPU per request must stay small beside the core's."""
    members = MEMBERS if tag != "search-seed" else (SEARCH_MEMBER,)
    headers = {m: _bearer(m) for m in members}
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(notes):
        queue.put_nowait(i)
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(base_url, connector=connector, timeout=timeout) as client:

        async def submitter() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                member_id = members[i % len(members)]
                began = time.perf_counter()
                async with client.post(
                    "/api/v1/records",
                    json={"externalPlaceId": f"{tag}-{i}", "placeName": "카페",
                          "body": _note(tag, i)},
                    headers=headers[member_id],
                ) as response:  # fmt: skip
                    await response.read()
                    assert response.status in (200, 201), response.status
                latencies.append(time.perf_counter() - began)

        started = time.monotonic()
        await asyncio.gather(*(submitter() for _ in range(concurrency)))
    return time.monotonic() - started, latencies


def _bearer(member_id: int) -> dict[str, str]:
    token = issue_token(member_id, secret=JWT_SECRET, ttl_seconds=3600)
    return {"Authorization": f"Bearer {token}"}


class Searches:
    """Client API searches of ``SEARCH_MEMBER``: latencies (seconds) of 200 answers, the
    other answers by status."""

    def __init__(self, client: aiohttp.ClientSession) -> None:
        self._client = client
        self._headers = _bearer(SEARCH_MEMBER)
        self._sent = 0
        self.latencies: list[float] = []
        self.others: dict[str, int] = {}

    async def one(self) -> None:
        query = SEARCH_QUERIES[self._sent % len(SEARCH_QUERIES)]
        self._sent += 1
        began = time.perf_counter()
        try:
            async with self._client.post(
                "/api/v1/search", json={"query": query, "limit": 20}, headers=self._headers
            ) as response:
                await response.read()
                status = str(response.status)
        except (aiohttp.ClientError, TimeoutError) as exc:
            status = type(exc).__name__
        if status == "200":
            self.latencies.append(time.perf_counter() - began)
        else:
            self.others[status] = self.others.get(status, 0) + 1

    async def open_loop(self, rate: float, until: asyncio.Event) -> None:
        """One search every ``1/rate`` s until ``until`` is set, then those in flight."""
        sent: list[asyncio.Task] = []
        while not until.is_set():
            sent.append(asyncio.create_task(self.one()))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(until.wait(), 1 / rate)
        await asyncio.gather(*sent)

    def summary(self) -> str:
        if not self.latencies:
            return f"no answer 200 (others {self.others})"
        others = f"; others {self.others}" if self.others else ""
        return (
            f"p50 {_percentile(self.latencies, 0.5) * 1000:.1f} ms, "
            f"p99 {_percentile(self.latencies, 0.99) * 1000:.1f} ms over "
            f"{len(self.latencies)} answers 200{others}"
        )


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, int(len(ordered) * share) - 1)]


async def _worker_alone(engine: AsyncEngine, worker: Process, notes: int) -> float:
    """The worker's own throughput (contexts/s): ``notes`` requests posted straight to it,
    each posted again at once while it answers 503, so its queue is never empty."""
    async with transaction(engine) as conn:
        await conn.execute(
            text(
                "INSERT INTO ai.context_ai_state (context_id, user_id, record_id) "
                "SELECT g, :owner, :owner FROM generate_series(CAST(:first AS bigint), "
                "CAST(:last AS bigint)) AS g"
            ),
            {"owner": DIRECT_OWNER, "first": DIRECT_FIRST_ID,
             "last": DIRECT_FIRST_ID + notes - 1},
        )  # fmt: skip
    ids = iter(range(DIRECT_FIRST_ID, DIRECT_FIRST_ID + notes))
    started = time.monotonic()
    async with httpx.AsyncClient(
        base_url=worker.base_url, timeout=30, headers={"X-Internal-Secret": SECRET}
    ) as client:

        async def poster() -> None:
            for context_id in ids:
                body = {"contextId": context_id, "userId": DIRECT_OWNER,
                        "recordId": DIRECT_OWNER, "text": NOTE.format(i=context_id),
                        "placeMeta": {"externalPlaceId": "direct", "name": "카페"}}  # fmt: skip
                for _attempt in range(100_000):  # again at once while the queue is full
                    answer = await client.post("/internal/v1/context/process", json=body)
                    if answer.status_code != 503:
                        break
                    await asyncio.sleep(0.01)

        await asyncio.gather(*(poster() for _ in range(16)))
    await _wait_finished(engine, f"context_id >= {DIRECT_FIRST_ID}", 1800)
    return notes / (time.monotonic() - started)


async def _report(engine: AsyncEngine, core: Process, label: str, drain: float) -> None:
    core_rows = f"context_id < {DIRECT_FIRST_ID}"
    failed = await _count(
        engine,
        f"SELECT count(*) FROM ai.context_ai_state WHERE {core_rows} "  # noqa: S608
        "AND 'FAILED' IN (embedding_status, keyword_status)",
    )
    retries = await _count(
        engine,
        f"SELECT coalesce(sum(retry_count), 0) FROM ai.context_ai_state WHERE {core_rows}",  # noqa: S608
    )
    metrics = await _metrics(f"http://127.0.0.1:{core.env['PINLOG_CORE_OPS_PORT']}")
    dispatches = "pinlog_core_dispatches_total"
    total, held = _sum(metrics, dispatches), _sum(metrics, dispatches, result="held")
    refused = _sum(metrics, dispatches, result="refused")
    unreachable = _sum(metrics, dispatches, result="unreachable")
    claims = _sum(metrics, "pinlog_core_rescan_claims_total")
    print(
        f"{label}: drained in {drain:.1f} s; FAILED {failed}; retries spent {retries}; "
        f"dispatches sent {total - held:.0f} (refused {refused:.0f}, unreachable "
        f"{unreachable:.0f}), held unsent {held:.0f}; rescan claims {claims:.0f}"
    )


async def run(args: argparse.Namespace) -> None:
    with FakeOpenAI() as fake:
        await _run(args, fake)


async def _run(args: argparse.Namespace, fake: FakeOpenAI) -> None:
    scenario, notes, queue, window = args.scenario, args.notes, args.queue, args.window
    concurrency = args.concurrency
    database_url = os.environ.get("PINLOG_CORE_DATABASE_URL") or embedded_postgres.start(
        Path(tempfile.mkdtemp(prefix="pinlog-bench-burst-")) / "pg", delete_on_exit=True
    )
    engine = create_engine(database_url, pool_size=2)
    await migrations.upgrade(engine)
    async with transaction(engine) as conn:
        for member_id in (*MEMBERS, SEARCH_MEMBER):
            await member.ensure(conn, member_id)
    if args.provider == "offline":
        profile = "local-hashing-char-ngram-1536-cosine-v1"
        worker_env = _environment(
            PINLOG_DATABASE_URL=database_url, PINLOG_INTERNAL_SECRET=SECRET,
            PINLOG_OFFLINE="true", PINLOG_QUEUE_CAPACITY=queue, PINLOG_LOG_LEVEL="WARNING",
            PINLOG_WORKER_CONCURRENCY=args.worker_concurrency,
        )  # fmt: skip
    else:
        profile = PROFILE
        worker_env = worker_environment(
            database_url, fake, internal_secret=SECRET, queue_capacity=queue,
            worker_concurrency=args.worker_concurrency, provider_timeout_seconds=20,
            processing_expiry_seconds=600, database_pool_size=args.worker_concurrency + 2,
            embedding_batch_size=16, log_level="WARNING",
        )  # fmt: skip
    loaded = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "app.cli", "presets", "load", env=worker_env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert await loaded.wait() == 0, "presets load failed"
    fake.set_fault("embeddings", Scripted(delay_seconds=args.embedding_ms / 1000))
    fake.set_fault("judge", Scripted(delay_seconds=args.judge_ms / 1000))
    worker = Process("app", worker_env)
    timings = {}
    if scenario == "outage":
        timings = {
            "PINLOG_CORE_PENDING_EXPIRY_SECONDS": window,
            "PINLOG_CORE_RESCAN_PERIOD_SECONDS": window,
        }
    core = Process(
        "core_service",
        _environment(
            PINLOG_CORE_DATABASE_URL=database_url,
            PINLOG_CORE_WORKER_BASE_URL=worker.base_url,
            PINLOG_CORE_INTERNAL_SECRET=SECRET,
            PINLOG_CORE_JWT_SECRET=JWT_SECRET,
            PINLOG_CORE_EMBEDDING_PROFILE=profile,
            PINLOG_CORE_LOG_LEVEL="WARNING",
            # /metrics is served on the operations listener only.
            PINLOG_CORE_OPS_PORT=_free_port(),
            **timings,
        ),
    )
    try:
        await worker.start()
        await core.start()
        core_rows = f"context_id < {DIRECT_FIRST_ID}"
        if scenario == "burst":
            throughput = await _worker_alone(engine, worker, notes)
            await _creates(core.base_url, args.search_notes, concurrency, "search-seed")
            await _wait_finished(engine, core_rows, args.limit_seconds)
            async with aiohttp.ClientSession(
                core.base_url, timeout=aiohttp.ClientTimeout(total=60)
            ) as client:
                idle = Searches(client)
                for _ in range(args.searches):
                    await idle.one()
                during, drained = Searches(client), asyncio.Event()
                searching = asyncio.create_task(during.open_loop(args.search_rate, drained))
                try:
                    created, latencies = await _creates(core.base_url, notes, concurrency, "burst")
                    drain = created + await _wait_finished(engine, core_rows, args.limit_seconds)
                finally:
                    drained.set()
                    await searching
            print(
                f"worker alone: {throughput:.1f} contexts/s (queue {queue}, concurrency "
                f"{args.worker_concurrency}, provider {args.provider}, embedding "
                f"{args.embedding_ms} ms, judge {args.judge_ms} ms); {notes} notes / that = "
                f"{notes / throughput:.1f} s"
            )
            print(
                f"through the core: {notes / created:.1f} creates/s accepted (concurrency "
                f"{concurrency}; create p50 {_percentile(latencies, 0.5) * 1000:.1f} ms, "
                f"p99 {_percentile(latencies, 0.99) * 1000:.1f} ms, "
                f"max {max(latencies) * 1000:.1f} ms); {notes / drain:.1f} notes/s completed "
                f"end to end = {notes / drain / throughput:.2f} x the worker alone"
            )
            await _report(engine, core, f"burst of {notes} creates ({created:.1f} s)", drain)
            print(
                f"search through the client API ({args.search_notes} notes of one member): "
                f"idle, {args.searches} sequential: {idle.summary()}; during the burst, "
                f"{args.search_rate:g}/s open loop: {during.summary()}"
            )
        else:
            await worker.stop()
            await _creates(core.base_url, notes, concurrency, "outage")
            await asyncio.sleep(4 * 2 * window)  # four retry windows: period + expiry each
            await worker.start()
            drain = await _wait_finished(engine, core_rows, args.limit_seconds)
            await _report(engine, core, f"outage of {8 * window:g} s, {notes} notes", drain)
    finally:
        await core.stop()
        await worker.stop()
        await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=("burst", "outage"), default="burst")
    parser.add_argument("--notes", type=int, default=2000)
    parser.add_argument("--queue", type=int, default=100, help="the worker's QUEUE_CAPACITY")
    parser.add_argument("--concurrency", type=int, default=16, help="clients creating at once")
    parser.add_argument("--window", type=float, default=2.0, help="outage: period = expiry (s)")
    parser.add_argument("--provider", choices=("fake", "offline"), default="fake")
    parser.add_argument("--embedding-ms", type=int, default=20, help="fake provider latency")
    parser.add_argument("--judge-ms", type=int, default=100, help="fake provider latency")
    parser.add_argument("--worker-concurrency", type=int, default=8)
    parser.add_argument("--searches", type=int, default=50, help="idle sequential searches")
    parser.add_argument("--search-rate", type=float, default=10.0, help="searches/s in the burst")
    parser.add_argument("--search-notes", type=int, default=100, help="the searched member's")
    parser.add_argument("--limit-seconds", type=float, default=1800, help="longest drain wait")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
