"""Backlogs and outages drain without spending the retry budget (docs/rescan.md "Budget",
"Backlog"): a real worker (fake OpenAI provider) and real core processes running their rescan
loops, each test with the clocks it needs.

The full-size burst (2,000 creates against a queue of 100) is ``bench/core_burst.py``; the
burst here keeps the same ratio of notes to queue places at a fifth of the size.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from app.repository import keyword_preset
from tests.core.harness import bearer, make_member
from tests.core.support import count
from tests.e2e.observe import metric, wait_until
from tests.e2e.processes import (
    ServiceProcess,
    core_environment,
    run_command,
    worker_environment,
)
from tests.fake_openai import Scripted, error_body

# Fairness and retry windows of bursts on the two cores: alone, in the serial pass.
pytestmark = pytest.mark.serial

OUTAGE_NOTES = 60
BURST_NOTES, BURST_QUEUE = 200, 10
DISPATCHES = "pinlog_core_dispatches_total"


@dataclass
class Stack:
    worker: ServiceProcess
    cores: list[ServiceProcess]

    @property
    def core(self) -> ServiceProcess:
        return self.cores[0]


@pytest.fixture
async def stack_factory(engine, migrated_database, bundled_preset_rows, fake_openai, tmp_path):
    """``async with stack_factory(worker={...}, core={...}, cores=1) as stack``: a worker and
    core processes with the given settings, members 1 and 2, the bundled presets."""
    async with engine.begin() as conn:
        await keyword_preset.upsert_all(conn, bundled_preset_rows)
    for member_id in (1, 2):
        await make_member(engine, member_id)

    @asynccontextmanager
    async def factory(*, worker=None, core=None, cores: int = 1) -> AsyncIterator[Stack]:
        worker_process = ServiceProcess(
            "app",
            worker_environment(migrated_database, fake_openai, **(worker or {})),
            tmp_path / "worker.log",
        )
        core_processes = [
            ServiceProcess(
                "core_service",
                core_environment(migrated_database, worker_process.base_url, **(core or {})),
                Path(tmp_path / f"core{i}.log"),
            )
            for i in range(cores)
        ]
        processes = [worker_process, *core_processes]
        try:
            await asyncio.gather(*(process.start() for process in processes))
            yield Stack(worker_process, core_processes)
        finally:
            await asyncio.gather(*(process.stop() for process in processes))

    return factory


async def _create_many(base_url: str, count_: int, *, member: int = 1, tag: str = "n") -> list:
    """``count_`` notes through the core's API, 16 at a time; their context ids in order."""
    limit = asyncio.Semaphore(16)
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:

        async def one(index: int) -> int:
            async with limit:
                response = await client.post(
                    "/api/v1/records",
                    json={
                        "externalPlaceId": f"{tag}-{index}",
                        "placeName": "카페",
                        "body": f"{tag} {index}: 창가 자리 조용하고 콘센트 많은 카페",
                    },
                    headers=bearer(member),
                )
            assert response.status_code == 201, response.text
            return response.json()["contextId"]

        return list(await asyncio.gather(*(one(i) for i in range(count_))))


async def _summary(engine) -> dict[str, int]:
    """Counts over every state row: finished, failed, retries spent."""
    sql = {
        "completed": "SELECT count(*) FROM ai.context_ai_state "
        "WHERE embedding_status = 'COMPLETED' AND keyword_status = 'COMPLETED'",
        "failed": "SELECT count(*) FROM ai.context_ai_state "
        "WHERE 'FAILED' IN (embedding_status, keyword_status)",
        "retries": "SELECT coalesce(sum(retry_count), 0) FROM ai.context_ai_state",
    }
    return {name: await count(engine, query) for name, query in sql.items()}


async def _all_completed(engine, expected: int) -> bool:
    return (await _summary(engine))["completed"] == expected


async def _dispatches_sent(ops_base_url: str) -> float:
    """Dispatches a core process sent (from its operations listener's metrics)."""
    base_url = ops_base_url
    total = await metric(base_url, DISPATCHES)
    return total - await metric(base_url, DISPATCHES, result="held")


async def test_a_worker_outage_of_four_retry_windows_fails_no_note(stack_factory, engine):
    """60 notes written while the worker is down for four retry windows (rescan period 1 s,
    pending expiry 1 s): with §9's rule (a claim spends a retry) every one would have spent
    its three retries and been FAILED; all complete once it is back, none with a retry spent
    (docs/rescan.md "Budget")."""
    timings = {"rescan_period_seconds": 1, "pending_expiry_seconds": 1}
    async with stack_factory(core=timings) as stack:
        await stack.worker.stop()
        context_ids = await _create_many(stack.core.base_url, OUTAGE_NOTES)
        outage = 4 * (timings["rescan_period_seconds"] + timings["pending_expiry_seconds"])
        await asyncio.sleep(outage)  # the outage itself: the worker stays down this long
        claims = await metric(stack.core.ops_base_url, "pinlog_core_rescan_claims_total")
        down = await _summary(engine)

        started = time.monotonic()
        await stack.worker.start()
        await wait_until(
            lambda: _all_completed(engine, OUTAGE_NOTES), within=60, what="every note done"
        )
        drained = time.monotonic() - started
        sent = await _dispatches_sent(stack.core.ops_base_url)

    after = await _summary(engine)
    assert down == {"completed": 0, "failed": 0, "retries": 0}
    assert claims >= OUTAGE_NOTES  # the rescan did re-request them meanwhile, for nothing
    assert after == {"completed": OUTAGE_NOTES, "failed": 0, "retries": 0}
    assert len(context_ids) == OUTAGE_NOTES
    print(
        f"\noutage: {OUTAGE_NOTES} notes, worker down {outage} s; rescan claims meanwhile "
        f"{claims:.0f}; drained {drained:.1f} s after the worker came back; "
        f"{sent:.0f} dispatches sent; FAILED {after['failed']}, retries {after['retries']}"
    )


async def test_a_provider_unavailable_for_four_retry_windows_fails_no_note(
    stack_factory, engine, fake_openai
):
    """The worker up, its embedding provider out of quota (docs/failures.md: after 3 faults the
    worker refuses process requests with 503 + Retry-After, probing every second) for four
    retry windows of the PROCESSING expiry (3 s): every note completes once the quota is back;
    the notes the worker took before it began to refuse spent at most one retry, the rest
    none."""
    quota = Scripted(
        status=429,
        json=error_body(
            "You exceeded your current quota",
            type="insufficient_quota",
            code="insufficient_quota",
        ),
    )
    fake_openai.set_fault("embeddings", quota)
    notes = 30
    async with stack_factory(
        worker={"breaker_threshold": 3, "breaker_cooldown_seconds": 1},
        core={"rescan_period_seconds": 1, "pending_expiry_seconds": 1},
    ) as stack:
        context_ids = await _create_many(stack.core.base_url, notes, tag="q")
        await asyncio.sleep(4 * (1 + 3))  # the fault lasts four retry windows
        ran_before = await _taken(engine)
        down = await _summary(engine)
        fake_openai.set_fault("embeddings", None)
        await wait_until(lambda: _all_completed(engine, notes), within=60, what="every note")
        retries = await _retries_by_context(engine, context_ids)

    assert down["failed"] == 0
    assert await _summary(engine) == {
        "completed": notes,
        "failed": 0,
        "retries": sum(retries.values()),
    }
    assert all(retries[cid] <= 1 for cid in ran_before)
    assert all(retries[cid] == 0 for cid in context_ids if cid not in ran_before)
    assert len(ran_before) < notes  # the refusals did start
    print(
        f"\nprovider out: {notes} notes, {len(ran_before)} taken by the worker before it "
        f"refused; retries spent {sum(retries.values())}; FAILED 0"
    )


async def _taken(engine) -> set[int]:
    """Contexts a worker has taken a dispatch of (docs/rescan.md "Budget")."""
    async with engine.connect() as conn:
        rows = await conn.exec_driver_sql(
            "SELECT context_id FROM ai.context_ai_state WHERE dispatch_accepted_at IS NOT NULL"
        )
        return {row.context_id for row in rows}


async def _retries_by_context(engine, context_ids: list[int]) -> dict[int, int]:
    return {
        cid: await count(
            engine, "SELECT retry_count FROM ai.context_ai_state WHERE context_id = :id", id=cid
        )
        for cid in context_ids
    }


async def test_a_burst_over_the_worker_queue_completes_without_spending_a_retry(
    stack_factory, engine, fake_openai
):
    """Twenty times the worker's queue in creates, production rescan timings (300 s), a worker
    slower than the creates (judge calls of 100 ms, 2 at once): the worker's 503s are honoured
    by the core's retry set, not left to a rescan minutes later."""
    fake_openai.script_judge(*(Scripted(delay_seconds=0.1) for _ in range(BURST_NOTES)))
    async with stack_factory(
        worker={"queue_capacity": BURST_QUEUE, "worker_concurrency": 2},
        core={"pending_expiry_seconds": 300, "processing_expiry_seconds": 600},
    ) as stack:
        started = time.monotonic()
        await _create_many(stack.core.base_url, BURST_NOTES)
        created = time.monotonic() - started
        await wait_until(
            lambda: _all_completed(engine, BURST_NOTES), within=120, what="every note done"
        )
        drained = time.monotonic() - started
        refused = await metric(stack.core.ops_base_url, DISPATCHES, result="refused")
        sent = await _dispatches_sent(stack.core.ops_base_url)
        claims = await metric(stack.core.ops_base_url, "pinlog_core_rescan_claims_total")

    after = await _summary(engine)
    assert after == {"completed": BURST_NOTES, "failed": 0, "retries": 0}
    assert refused > 0  # the queue did overflow
    assert claims == 0  # no row waited for the rescan
    print(
        f"\nburst: {BURST_NOTES} creates in {created:.1f} s against a queue of {BURST_QUEUE}; "
        f"all COMPLETED after {drained:.1f} s; {sent:.0f} dispatches sent ({refused:.0f} "
        f"refused); FAILED {after['failed']}, retries {after['retries']}"
    )


async def test_a_pause_during_a_burst_sends_spends_and_fails_nothing_on_two_cores(
    stack_factory, engine, migrated_database
):
    """``pinlog-core pause`` while notes arrive through two core processes (rescan period 1 s;
    a retry set of 10, so most notes are handed to the rescans, due at once): once it returns
    neither core sends anything, the rescans claim and spend nothing, nothing fails; ``resume``
    drains everything. (A pending expiry of 20 s: shorter than a note's wait in the worker's
    queue, it would re-request queued notes, rightly counted.)"""
    settings = {
        "rescan_period_seconds": 1,
        "pending_expiry_seconds": 20,
        "dispatch_retry_capacity": 10,
    }
    async with stack_factory(core=settings, cores=2) as stack:
        env = core_environment(migrated_database, stack.worker.base_url)
        before = asyncio.create_task(_create_many(stack.cores[0].base_url, 40, tag="a"))
        code, out, err = await run_command("core_service.cli", "pause", env=env)
        assert (code, out.strip()) == (0, "dispatch paused"), err
        sent = [await _dispatches_sent(core.ops_base_url) for core in stack.cores]
        await before
        await asyncio.gather(
            _create_many(stack.cores[0].base_url, 40, tag="b"),
            _create_many(stack.cores[1].base_url, 40, tag="c"),
        )
        await asyncio.sleep(3)  # three rescan periods, paused
        still = [await _dispatches_sent(core.ops_base_url) for core in stack.cores]
        paused = await _summary(engine)
        async with httpx.AsyncClient(base_url=stack.core.ops_base_url, timeout=5) as client:
            readiness = await client.get("/readyz")

        started = time.monotonic()
        code, out, err = await run_command("core_service.cli", "resume", env=env)
        assert (code, out.strip()) == (0, "dispatch running"), err
        await wait_until(lambda: _all_completed(engine, 120), within=60, what="every note done")
        drained = time.monotonic() - started

    assert still == sent  # no dispatch after pause returned, on either core
    assert paused["failed"] == 0 and paused["retries"] == 0
    assert readiness.status_code == 200 and readiness.json()["dispatch"] == "paused"
    assert await _summary(engine) == {"completed": 120, "failed": 0, "retries": 0}
    print(f"\npause: 120 notes, 2 cores; drained {drained:.1f} s after `resume` started")


IMPORT_NOTES, WRITER_NOTES = 200, 5
# The bound for a note of another member (docs/scaling.md "Fairness"): the worker's queue ahead
# of it (20 places at about 20 contexts/s here) plus one Retry-After with jitter and the
# held requests' turn, with room for a loaded machine; it does not depend on IMPORT_NOTES.
WRITER_BOUND_SECONDS = 10


async def test_one_members_import_does_not_delay_another_members_notes_by_its_length(
    stack_factory, engine, fake_openai
):
    """Member 1 imports 200 notes into a worker slower than the import (queue 20, judge calls
    of 100 ms, 2 at once); member 2 writes 5 notes meanwhile: each of those completes within
    a bound set by the worker's queue, not by the import."""
    fake_openai.script_judge(
        *(Scripted(delay_seconds=0.1) for _ in range(IMPORT_NOTES + WRITER_NOTES))
    )
    async with stack_factory(
        worker={"queue_capacity": 20, "worker_concurrency": 2},
        core={"pending_expiry_seconds": 300, "processing_expiry_seconds": 600},
    ) as stack:
        started = time.monotonic()
        importing = asyncio.create_task(
            _create_many(stack.core.base_url, IMPORT_NOTES, member=1, tag="import")
        )
        await wait_until(lambda: _completed_at_least(engine, 20), what="the import under way")
        waits = []
        for index in range(WRITER_NOTES):
            (context_id,) = await _create_many(stack.core.base_url, 1, member=2, tag=f"w{index}")
            written = time.monotonic()
            await wait_until(lambda c=context_id: _completed(engine, c), within=60, what="a note")
            waits.append(time.monotonic() - written)
        await importing
        await wait_until(
            lambda: _all_completed(engine, IMPORT_NOTES + WRITER_NOTES), within=120, what="all"
        )
        imported = time.monotonic() - started

    assert max(waits) < WRITER_BOUND_SECONDS < imported
    assert await _summary(engine) == {
        "completed": IMPORT_NOTES + WRITER_NOTES,
        "failed": 0,
        "retries": 0,
    }
    print(
        f"\nfairness: member 1 imported {IMPORT_NOTES} notes in {imported:.1f} s; member 2's "
        f"{WRITER_NOTES} notes completed after {', '.join(f'{w:.1f}' for w in waits)} s"
    )


async def _completed(engine, context_id: int) -> bool:
    return bool(
        await count(
            engine,
            "SELECT count(*) FROM ai.context_ai_state WHERE context_id = :id "
            "AND embedding_status = 'COMPLETED' AND keyword_status = 'COMPLETED'",
            id=context_id,
        )
    )


async def _completed_at_least(engine, expected: int) -> bool:
    return (await _summary(engine))["completed"] >= expected
