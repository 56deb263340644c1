"""``build_core`` builds the core with no HTTP app around it; on exit its loops (rescan,
status gauges, the dispatcher's retries) stop and nothing it started keeps running."""

from __future__ import annotations

import asyncio

from sqlalchemy import text

from core_service.composition import build_core
from core_service.metrics import CoreMetrics
from core_service.repository import embedding_switch
from core_service.repository.db import autocommit
from tests.core.harness import core_settings, profile_workers
from tests.core.support import TARGET, judged
from tests.worker.harness import PROFILE


def _loops(name: str) -> list[asyncio.Task]:
    return [
        task
        for task in asyncio.all_tasks()
        if not task.done() and name in getattr(task.get_coro(), "__qualname__", "")
    ]


def _rescan_loops() -> list[asyncio.Task]:
    return _loops("RescanScheduler.run_forever")


def _backfill_loops() -> list[asyncio.Task]:
    return _loops("ReembedBackfill.run_forever")


def _all_loops() -> list[asyncio.Task]:
    return [
        *_rescan_loops(),
        *_backfill_loops(),
        *_loops("StatusGauges.run_forever"),
        *_loops("WorkerDispatcher._run"),
    ]


async def test_the_core_is_built_without_http_and_its_rescan_loop_stops_on_exit(
    migrated_database, fake_worker
):
    settings = core_settings(migrated_database, fake_worker.base_url)

    async with build_core(settings, CoreMetrics()) as core:
        assert len(_rescan_loops()) == 1
        assert len(_backfill_loops()) == 1
        assert len(_all_loops()) == 4
        async with core.probe_engine.connect() as conn:
            assert (await conn.execute(text("SELECT 1"))).scalar_one() == 1

    assert _all_loops() == []


async def test_without_the_loop_the_caller_runs_rescans(migrated_database, fake_worker):
    settings = core_settings(migrated_database, fake_worker.base_url)

    async with build_core(settings, CoreMetrics(), run_rescan_loop=False):
        assert _rescan_loops() == []


async def test_without_the_rescan_loop_the_backfill_of_a_switch_still_runs(
    engine, migrated_database, core_with_fake_worker
):
    """Issue 28 #3: ``serve --no-rescan`` (rescans from a scheduler) still backfills a switch:
    the loop seeds the rows and sends them to a worker of the target profile over HTTP."""
    ids = sorted(
        [await judged(core_with_fake_worker, engine, f"메모 {n}", place=f"p{n}") for n in range(2)]
    )
    async with autocommit(engine) as conn:
        assert await embedding_switch.start(
            conn, in_use=PROFILE, target=TARGET, rate=50, generation=None
        )
    async with profile_workers(TARGET) as (worker,):
        settings = core_settings(migrated_database, worker.base_url)
        async with build_core(settings, CoreMetrics(), run_rescan_loop=False):
            assert _rescan_loops() == []
            assert len(_backfill_loops()) == 1
            await asyncio.wait_for(worker.batch_arrived.wait(), 30)

    assert worker.batched_context_ids()[0] == ids
