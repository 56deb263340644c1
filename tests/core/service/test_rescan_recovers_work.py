"""The rescan's re-request reaches a real worker and recovers work (§9, §10 scenarios 8, 18).

The core creates contexts against a fake worker (so nothing is processed on create); the
scheduler under test dispatches to a real worker with the fake OpenAI provider.
"""

from __future__ import annotations

import asyncio

from core_service.composition import build_dispatcher, build_scheduler, build_worker_endpoints
from core_service.metrics import CoreMetrics
from tests.core import support as facts
from tests.core.harness import bearer
from tests.worker.support import arrived, release, set_statuses

PROCESSING_STALE = 601


async def _wait_for(engine, context_id, statuses):
    async with asyncio.timeout(10):
        while (await facts.state(engine, context_id)).statuses != statuses:  # noqa: ASYNC110
            await asyncio.sleep(0.05)  # polls the database: no event to wait on


async def _rescan_to(worker, core):
    """A scheduler on the core's database whose dispatcher talks to the real ``worker``."""
    settings = core.settings.model_copy(update={"worker_base_url": str(worker.client.base_url)})
    endpoints = build_worker_endpoints(settings)
    metrics = CoreMetrics()
    engine = core.app.state.engine
    dispatcher = build_dispatcher(settings, engine, endpoints, metrics)
    scheduler = build_scheduler(settings, engine, dispatcher, metrics)
    return scheduler, endpoints


async def test_scenario_8_a_stage_left_processing_by_a_dead_worker_is_reclaimed_and_completed(
    core_with_fake_worker, worker, engine, fake_openai
):
    created = (await core_with_fake_worker.create(1, "노트북 작업하기 좋은 조용한 카페")).json()
    context_id = created["contextId"]
    # What a worker killed mid-stage leaves: the claim committed, nothing saved, clock stopped.
    await set_statuses(
        engine, context_id=context_id, embedding_status="PROCESSING", keyword_status="PENDING"
    )
    await facts.backdate(engine, context_id, PROCESSING_STALE)
    scheduler, endpoints = await _rescan_to(worker, core_with_fake_worker)
    try:
        report = await scheduler.run_once()
        await _wait_for(engine, context_id, ("COMPLETED", "COMPLETED"))
    finally:
        await endpoints.aclose()

    assert (report.claimed, report.dispatched) == (1, 1)
    assert (await facts.state(engine, context_id)).retry_count == 1
    assert fake_openai.embedding_calls == 1
    assert await facts.embedding_deleted(engine, context_id) is False


async def test_scenario_18_a_context_deleted_after_the_rescan_picked_it_stores_nothing(
    core_with_fake_worker, worker, engine, fake_openai, hold
):
    first = (await core_with_fake_worker.create(1, "첫 메모")).json()
    second = (await core_with_fake_worker.create(1, "두 번째 메모")).json()
    context_id = first["contextId"]
    await facts.backdate(engine, context_id, 301)
    held = hold()
    fake_openai.script_embeddings(held)
    scheduler, endpoints = await _rescan_to(worker, core_with_fake_worker)
    try:
        report = await scheduler.run_once()
        await arrived(held)  # the worker runs the rescanned context's embedding call
        deleted = await core_with_fake_worker.client.delete(
            f"/api/v1/contexts/{context_id}", headers=bearer(1)
        )
        release(held)
        await worker.drain()
    finally:
        await endpoints.aclose()

    assert report.dispatched == 1 and deleted.status_code == 204
    assert (await facts.state(engine, context_id)).statuses == ("CANCELLED", "CANCELLED")
    assert await facts.embedding_deleted(engine, context_id) is None
    assert (await facts.state(engine, second["contextId"])).statuses == ("PENDING", "PENDING")
