"""Scale-out on one database (docs/scaling.md): two worker processes and two core processes
(two rescan loops) against one PostgreSQL, 300 contexts through the core's API, one worker
SIGKILLed mid-burst and restarted. PostgreSQL coordinates everything: conditional claims,
``SKIP LOCKED`` rescans, row locks. Prints its figures."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter

import httpx
from sqlalchemy import text

from app.repository import keyword_preset
from tests.core.harness import bearer, make_member
from tests.core.support import count
from tests.e2e.observe import wait_until
from tests.e2e.processes import ServiceProcess, core_environment, worker_environment
from tests.fake_openai import Scripted

CONTEXTS = 300
SUBMITTERS = 16
KILL_AFTER = 100  # creates answered before the first worker is killed
MARKER = re.compile(r"scale-out note (\d+)")
# Generous clocks: on a loaded 2-core machine a burst must never look stale to the rescan
# (three needless re-requests would exhaust a context's retries while it waits in a queue).
PENDING_EXPIRY_SECONDS = 20
PROCESSING_EXPIRY_SECONDS = 6


def _note(index: int) -> str:
    return f"scale-out note {index}: 창가 자리 조용하고 콘센트 많은 카페"


def _markers(texts: list[str]) -> list[int]:
    return [int(m.group(1)) for text in texts for m in MARKER.finditer(text)]


async def test_two_workers_two_cores_one_database_survive_a_killed_worker(
    engine, migrated_database, bundled_preset_rows, fake_openai, tmp_path
):
    async with engine.begin() as conn:
        await keyword_preset.upsert_all(conn, bundled_preset_rows)
    for member_id in range(1, 5):
        await make_member(engine, member_id)
    # Small provider latencies, so that the kill finds calls in flight.
    fake_openai.script_embeddings(*(Scripted(delay_seconds=0.02) for _ in range(2 * CONTEXTS)))
    fake_openai.script_judge(*(Scripted(delay_seconds=0.05) for _ in range(2 * CONTEXTS)))
    workers = [
        ServiceProcess(
            "app",
            worker_environment(
                migrated_database,
                fake_openai,
                database_pool_size=6,
                processing_expiry_seconds=PROCESSING_EXPIRY_SECONDS,
            ),
            tmp_path / f"worker{i}.log",
        )
        for i in range(2)
    ]
    urls = ",".join(worker.base_url for worker in workers)
    cores = [
        ServiceProcess(
            "core_service",
            core_environment(
                migrated_database,
                urls,
                rescan_period_seconds=1,
                pending_expiry_seconds=PENDING_EXPIRY_SECONDS,
                processing_expiry_seconds=PROCESSING_EXPIRY_SECONDS,
            ),
            tmp_path / f"core{i}.log",
        )
        for i in range(2)
    ]
    try:
        await asyncio.gather(*(process.start() for process in [*workers, *cores]))
        started = time.monotonic()
        context_ids, killed_at, restarted_at = await _burst(cores, workers[0])
        await wait_until(
            lambda: _all_finished(engine, context_ids),
            within=150,
            what="every context to finish",
        )
        finished = time.monotonic()
    finally:
        await asyncio.gather(*(process.stop() for process in [*cores, *workers]))

    states = await _states(engine, context_ids)
    embedded = Counter(_markers([t for r in fake_openai.embedding_requests for t in r["input"]]))
    judged = Counter(
        _markers([json.dumps(r, ensure_ascii=False) for r in fake_openai.judge_requests])
    )
    index_of = {context_id: index for index, context_id in enumerate(context_ids)}
    rescanned = {cid for cid, (_e, _k, retries) in states.items() if retries > 0}
    repeated = {
        cid for cid in context_ids if embedded[index_of[cid]] > 1 or judged[index_of[cid]] > 1
    }

    assert {(e, k) for e, k, _ in states.values()} == {("COMPLETED", "COMPLETED")}
    assert max(retries for _, _, retries in states.values()) <= 3
    assert all(embedded[index_of[cid]] >= 1 and judged[index_of[cid]] >= 1 for cid in context_ids)
    # Only work the killed worker had in flight ran twice; everything else exactly once.
    assert repeated <= rescanned
    assert len(repeated) <= 8  # at most its 4 running tasks, each in one of two stages
    assert await count(engine, "SELECT count(*) FROM core.record") <= 4 * 25
    print(
        f"\nscale-out: {CONTEXTS} contexts through 2 cores and 2 workers in "
        f"{finished - started:.1f} s ({CONTEXTS / (finished - started):.1f} contexts/s); "
        f"worker killed at {killed_at - started:.1f} s, "
        f"restarted at {restarted_at - started:.1f} s; "
        f"{len(rescanned)} contexts re-requested by a rescan, {len(repeated)} ran a stage twice; "
        f"embedding inputs {sum(embedded.values())}, judge calls {sum(judged.values())}"
    )


async def _burst(cores, victim: ServiceProcess) -> tuple[list[int], float, float]:
    clients = [httpx.AsyncClient(base_url=core.base_url, timeout=30) for core in cores]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(CONTEXTS):
        queue.put_nowait(index)
    context_ids: dict[int, int] = {}
    answered = asyncio.Event()

    async def submitter() -> None:
        while not queue.empty():
            index = queue.get_nowait()
            member = 1 + index % 4
            response = await clients[index % 2].post(
                "/api/v1/records",
                json={
                    "externalPlaceId": f"place-{index % 25}",
                    "placeName": "카페",
                    "body": _note(index),
                },
                headers=bearer(member),
            )
            assert response.status_code in (200, 201), response.text
            context_ids[index] = response.json()["contextId"]
            if len(context_ids) >= KILL_AFTER:
                answered.set()

    async def killer() -> tuple[float, float]:
        await answered.wait()
        await victim.kill()
        killed = time.monotonic()
        await asyncio.sleep(1.0)  # the replica stays down for a second, as a crash would
        await victim.start()
        return killed, time.monotonic()

    try:
        killing = asyncio.create_task(killer())
        await asyncio.gather(*(submitter() for _ in range(SUBMITTERS)))
        killed_at, restarted_at = await killing
    finally:
        for client in clients:
            await client.aclose()
    return [context_ids[index] for index in range(CONTEXTS)], killed_at, restarted_at


async def _states(engine, context_ids) -> dict[int, tuple[str, str, int]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT context_id, embedding_status, keyword_status, retry_count "
                "FROM ai.context_ai_state WHERE context_id = ANY(CAST(:ids AS bigint[]))"
            ),
            {"ids": context_ids},
        )
        return {row[0]: (row[1], row[2], row[3]) for row in rows}


async def _all_finished(engine, context_ids) -> bool:
    states = await _states(engine, context_ids)
    return len(states) == len(context_ids) and all(
        e in ("COMPLETED", "FAILED", "CANCELLED") and k in ("COMPLETED", "FAILED", "CANCELLED")
        for e, k, _ in states.values()
    )
