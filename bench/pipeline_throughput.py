"""Benchmark: offline pipeline throughput and POST-to-COMPLETED latency on real parts.

Embedded PostgreSQL (or ``PINLOG_DATABASE_URL``), offline providers, the worker as its own
``pinlog-ai serve`` process (so the load generator does not share its event loop), contexts
created as the core side does. Prints figures; asserts nothing.

    .venv/bin/python -m bench.pipeline_throughput --contexts 1000 --concurrency 4
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from app import embedded_postgres
from app.repository.db import create_engine
from app.settings import DatabaseSettings, Settings
from bench import state_rows
from demo.feed import load_samples
from demo.run import free_port, offline_settings, prepare_database

PROCESS_PATH = "/internal/v1/context/process"


async def run(contexts: int, concurrency: int) -> None:
    database_url = DatabaseSettings().database_url or embedded_postgres.start(
        Path(tempfile.mkdtemp(prefix="pinlog-bench-")) / "pg", delete_on_exit=True
    )
    settings = offline_settings(
        database_url, worker_concurrency=concurrency, queue_capacity=contexts
    )
    await prepare_database(settings)
    port = free_port(0)
    worker = await _start_worker(settings, port)

    samples = load_samples()
    engine = create_engine(database_url, pool_size=2)
    ids = await state_rows.reserve_context_ids(engine, contexts)
    posted_at: dict[int, float] = {}
    completed_at: dict[int, float] = {}
    poller = asyncio.create_task(_poll_completions(engine, posted_at, completed_at, len(ids)))
    headers = {"X-Internal-Secret": settings.internal_secret.get_secret_value()}
    for context_id in ids:  # the core side's commits come first, outside the measurement
        await state_rows.create_pending_state(engine, context_id)
    senders = asyncio.Semaphore(16)
    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=headers) as client:

        async def post(n: int, context_id: int) -> None:
            sample = samples[n % len(samples)]
            body = {
                "contextId": context_id,
                "userId": sample.user_id,
                "recordId": sample.record_id,
                "text": f"{sample.text} ({n})",  # distinct texts: no provider-side caching
            }
            async with senders:
                response = await client.post(PROCESS_PATH, json=body)
            response.raise_for_status()
            posted_at[context_id] = time.perf_counter()

        await asyncio.gather(*(post(n, context_id) for n, context_id in enumerate(ids)))
    posting_seconds = time.perf_counter() - started
    await poller
    total_seconds = time.perf_counter() - started

    latencies_ms = sorted((completed_at[i] - posted_at[i]) * 1000 for i in ids)
    print(f"contexts: {contexts}, worker concurrency: {concurrency}")
    print(f"POSTs (16 in parallel): {posting_seconds:.2f} s ({contexts / posting_seconds:.0f}/s)")
    print(f"all completed after: {total_seconds:.2f} s ({contexts / total_seconds:.1f} contexts/s)")
    print(
        "POST-to-COMPLETED latency (ms, 20 ms polling): "
        f"p50 {statistics.median(latencies_ms):.0f}, "
        f"p95 {latencies_ms[int(len(latencies_ms) * 0.95) - 1]:.0f}, "
        f"max {latencies_ms[-1]:.0f}"
    )
    await engine.dispose()
    worker.terminate()
    await worker.wait()


async def _poll_completions(
    engine, posted_at: dict[int, float], completed_at: dict[int, float], expected: int
) -> None:
    """Record when each posted context's keyword stage reached a final status."""
    while len(completed_at) < expected:
        pending = [i for i in posted_at if i not in completed_at]
        if pending:
            now = time.perf_counter()
            statuses = await state_rows.keyword_statuses(engine, pending)
            for context_id, keyword_status in statuses.items():
                if keyword_status not in ("PENDING", "PROCESSING"):
                    completed_at[context_id] = now
        await asyncio.sleep(0.02)


async def _start_worker(settings: Settings, port: int) -> asyncio.subprocess.Process:
    """``pinlog-ai serve`` in its own process, configured through its environment."""
    env = {**os.environ, "PINLOG_WORKER_CONCURRENCY": str(settings.worker_concurrency)}
    for name in (
        "offline",
        "database_url",
        "embedding_provider",
        "embedding_model",
        "embedding_profile",
        "embedding_dimension",
        "judge_provider",
        "keyword_top_k",
        "keyword_similarity_floor",
        "judge_similarity_threshold",
        "queue_capacity",
    ):
        env[f"PINLOG_{name.upper()}"] = str(getattr(settings, name))
    env["PINLOG_INTERNAL_SECRET"] = settings.internal_secret.get_secret_value()
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app.cli",
        "serve",
        "--port",
        str(port),
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        for _ in range(300):
            with contextlib.suppress(httpx.TransportError):
                if (await client.get("/readyz")).status_code == 200:
                    return worker
            await asyncio.sleep(0.1)
    worker.terminate()
    raise RuntimeError("worker did not become ready")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=4)
    arguments = parser.parse_args()
    asyncio.run(run(arguments.contexts, arguments.concurrency))


if __name__ == "__main__":
    main()
