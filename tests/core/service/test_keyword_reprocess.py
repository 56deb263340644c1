"""A reclassification run (``operations.keyword_reprocess``) against workers over real HTTP
(``FakeWorker``: real servers answering ``/readyz`` and the process endpoint): nothing is reset
until every listed worker reports the current list version of the profile; then batches of
``rate`` contexts, one a second at most, each context dispatched once (origin ``reprocess``,
its first accepted dispatch free); nothing is reset while dispatching is paused."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import generate_latest
from sqlalchemy import text

from core_service.composition import build_dispatcher, build_worker_endpoints
from core_service.metrics import CoreMetrics
from core_service.operations import pause
from core_service.operations.keyword_reprocess import (
    KeywordReprocess,
    NoUsablePresets,
    ProfileInUseChanged,
    WorkersNotReady,
)
from core_service.repository import dispatch_control
from core_service.repository.db import transaction
from core_service.service.worker_readiness import ReadinessReader
from tests.core import support as facts
from tests.core.harness import core_settings
from tests.fake_worker import FakeWorker
from tests.worker.harness import PROFILE, SECRET, sample_value, serving
from tests.worker.support import make_preset

LIST_VERSION = 2


@pytest.fixture
async def second_fake_worker():
    worker = FakeWorker(SECRET)
    async with serving(worker.app) as base_url:
        worker.base_url = base_url
        yield worker
        worker.release.set()


async def _stale_contexts(engine, core, count: int) -> list[int]:
    """``count`` live contexts judged with list 1, the stored list at ``LIST_VERSION``."""
    await make_preset(engine, preset_id=1, version=LIST_VERSION, profile=PROFILE)
    context_ids = []
    for index in range(count):
        response = await core.create(1, f"다시 판정할 메모 {index}", place=f"place-{index}")
        record_id, context_id = response.json()["recordId"], response.json()["contextId"]
        await facts.make_judged(
            engine, context_id=context_id, user_id=1, record_id=record_id, profile=PROFILE,
            preset_version=1, keyword_ids=(1,),
        )  # fmt: skip
        context_ids.append(context_id)
    return context_ids


async def test_nothing_is_reset_until_every_worker_reports_the_current_list(
    engine, core_with_fake_worker, fake_worker, second_fake_worker
):
    (context_id,) = await _stale_contexts(engine, core_with_fake_worker, 1)
    reprocess = KeywordReprocess(engine, profile=PROFILE)
    unreachable = "http://127.0.0.1:9"  # discard port: nothing listens
    reader = ReadinessReader([fake_worker.base_url, second_fake_worker.base_url, unreachable])
    looks: list[int] = []
    try:
        fake_worker.preset_version = LIST_VERSION
        second_fake_worker.preset_version = 1  # still on the old list
        with pytest.raises(WorkersNotReady) as waited:
            await reprocess.wait_for_workers(
                reader,
                timeout_seconds=0.3,
                poll_seconds=0.1,
                on_wait=lambda version, readings: looks.append(version),
            )
        second_fake_worker.preset_version = LIST_VERSION
        second_fake_worker.profile = "another-profile-1536-cosine-v1"
        with pytest.raises(WorkersNotReady):
            await reprocess.wait_for_workers(reader, timeout_seconds=0)
        second_fake_worker.profile = PROFILE
        reader_of_two = ReadinessReader([fake_worker.base_url, second_fake_worker.base_url])
        try:
            version = await reprocess.wait_for_workers(reader_of_two, timeout_seconds=5)
        finally:
            await reader_of_two.aclose()
    finally:
        await reader.aclose()

    assert waited.value.version == LIST_VERSION
    assert set(looks) == {LIST_VERSION}
    described = [reading.describe() for reading in waited.value.readings]
    assert described[1].endswith(f"profile {PROFILE}, list version 1, ready")
    assert described[2] == "http://127.0.0.1:9: unreachable (ClientConnectorError)"
    assert version == LIST_VERSION
    # Waiting wrote nothing.
    assert (await facts.state(engine, context_id)).statuses == ("COMPLETED", "COMPLETED")


async def test_no_usable_preset_under_the_profile_is_refused(engine, core_with_fake_worker):
    with pytest.raises(NoUsablePresets):
        await KeywordReprocess(engine, profile=PROFILE).plan()


async def test_batches_of_rate_contexts_a_second_each_dispatched_once(
    engine, core_with_fake_worker, fake_worker
):
    context_ids = await _stale_contexts(engine, core_with_fake_worker, 25)
    await fake_worker.wait_for_requests(25)  # the creates' own dispatches
    created_requests = len(fake_worker.requests)
    settings = core_settings(core_with_fake_worker.settings.database_url, fake_worker.base_url)
    metrics = CoreMetrics()
    endpoints = build_worker_endpoints(settings)
    dispatcher = build_dispatcher(settings, engine, endpoints, metrics)
    dispatcher.start()
    reprocess = KeywordReprocess(engine, profile=PROFILE)
    progress: list[tuple[int, float]] = []
    try:
        plan = await reprocess.plan()
        started = time.monotonic()
        report = await reprocess.run(
            plan,
            dispatcher,
            rate=10,
            on_progress=lambda r: progress.append((r.reset, time.monotonic() - started)),
        )
    finally:
        await dispatcher.close(2.0)
        await endpoints.aclose()

    assert (plan.version, plan.stale) == (LIST_VERSION, 25)
    assert (report.reset, report.taken, report.waiting, report.skipped) == (25, 25, 0, 0)
    assert [reset for reset, _ in progress] == [10, 20, 25]
    assert progress[1][1] >= 0.95 and progress[2][1] >= 1.95  # one batch a second at most
    sent = fake_worker.context_ids()[created_requests:]
    assert sorted(sent) == context_ids  # each once
    assert sorted(sent[:10]) == context_ids[:10]  # batch by batch, in id order
    exposition = generate_latest(metrics.registry).decode()
    dispatched = sample_value(
        exposition, "pinlog_core_dispatches_total", origin="reprocess", result="accepted"
    )
    assert dispatched == 25
    for context_id in context_ids:
        state = await facts.state(engine, context_id)
        # Sent back with a fresh budget; its accepted dispatch was free.
        assert (state.statuses, state.retry_count) == (("COMPLETED", "PENDING"), 0)
    assert (await reprocess.plan()).stale == 0


async def test_nothing_is_reset_while_dispatching_is_paused(
    engine, core_with_fake_worker, fake_worker
):
    (context_id,) = await _stale_contexts(engine, core_with_fake_worker, 1)
    settings = core_settings(core_with_fake_worker.settings.database_url, fake_worker.base_url)
    endpoints = build_worker_endpoints(settings)
    dispatcher = build_dispatcher(settings, engine, endpoints, CoreMetrics())
    dispatcher.start()
    reprocess = KeywordReprocess(engine, profile=PROFILE)
    told = asyncio.Event()
    try:
        async with transaction(engine) as conn:
            await dispatch_control.set_paused(conn, paused=True)
        run = asyncio.create_task(
            reprocess.run(await reprocess.plan(), dispatcher, rate=10, on_paused=told.set)
        )
        await asyncio.wait_for(told.wait(), 5)
        assert (await facts.state(engine, context_id)).statuses == ("COMPLETED", "COMPLETED")
        await pause.change(engine, paused=False)
        report = await asyncio.wait_for(run, 10)
    finally:
        await dispatcher.close(2.0)
        await endpoints.aclose()

    assert (report.reset, report.taken) == (1, 1)
    assert (await facts.state(engine, context_id)).statuses == ("COMPLETED", "PENDING")


async def test_a_cutover_during_the_run_stops_it_before_resetting_under_the_old_profile(
    engine, core_with_fake_worker, fake_worker
):
    """A run resets under the profile in use it read; a cutover that commits between two of
    its batches stops it (``ProfileInUseChanged``) before anything more is reset under the
    old profile (each batch share-locks the switch row and compares)."""
    context_ids = await _stale_contexts(engine, core_with_fake_worker, 3)
    await fake_worker.wait_for_requests(3)
    settings = core_settings(core_with_fake_worker.settings.database_url, fake_worker.base_url)
    endpoints = build_worker_endpoints(settings)
    dispatcher = build_dispatcher(settings, engine, endpoints, CoreMetrics())
    dispatcher.start()
    async with transaction(engine) as conn:
        # What `reembed start` does first: the judgments name the profile they were made under.
        await conn.execute(
            text("UPDATE ai.context_keyword_analysis SET embedding_profile = :p"), {"p": PROFILE}
        )
        assert await facts.switch_start(conn, in_use=PROFILE, target=facts.TARGET, rate=50)
    reprocess = KeywordReprocess(engine, profile=PROFILE)
    first_batch = asyncio.Event()

    async def cut_over_after_the_first_batch() -> None:
        await first_batch.wait()
        async with transaction(engine) as conn:
            assert await facts.switch_cut_over(conn, force=True)

    try:
        plan = await reprocess.plan()
        cutting = asyncio.create_task(cut_over_after_the_first_batch())
        with pytest.raises(ProfileInUseChanged) as stopped:
            await reprocess.run(plan, dispatcher, rate=1, on_progress=lambda _: first_batch.set())
        await cutting
    finally:
        await dispatcher.close(2.0)
        await endpoints.aclose()

    assert (stopped.value.in_use, stopped.value.report.reset) == (facts.TARGET, 1)
    statuses = [(await facts.state(engine, context_id)).statuses for context_id in context_ids]
    assert statuses == [
        ("COMPLETED", "PENDING"),
        ("COMPLETED", "COMPLETED"),
        ("COMPLETED", "COMPLETED"),
    ]
