"""The rescan scheduler and the finalizer (§9), run through ``RescanScheduler.run_once`` on the
real database, dispatching over HTTP to a fake worker that records requests."""

from __future__ import annotations

import asyncio
import logging

import pytest
from pydantic import ValidationError
from sqlalchemy import text

from core_service.composition import build_dispatcher, build_scheduler, build_worker_endpoints
from core_service.metrics import CoreMetrics
from core_service.repository.db import create_engine
from tests.core import support as facts
from tests.core.harness import bearer, core_settings
from tests.worker.open_transactions import cancelled_in_open_transaction
from tests.worker.support import failure_reasons, make_state, set_statuses

PENDING_STALE = 301  # seconds: past the 300 s PENDING expiry
PROCESSING_STALE = 601  # seconds: past the 600 s PROCESSING expiry


async def _create(core, body="조용한 카페", place="place-1") -> int:
    """Create a note and wait for its after-commit dispatch (and its counting) to finish."""
    response = await core.create(1, body, place=place)
    assert response.status_code in (200, 201), response.text
    await core.app.state.dispatcher.drain(5)
    return response.json()["contextId"]


async def test_stale_pending_is_claimed_once_dispatched_and_updated_at_is_untouched(
    core_with_fake_worker, fake_worker, engine
):
    context_id = await _create(core_with_fake_worker)
    await fake_worker.wait_for_requests(1)
    await facts.backdate(engine, context_id, PENDING_STALE)
    before = await facts.state(engine, context_id)

    report = await core_with_fake_worker.scheduler().run_once()

    after = await facts.state(engine, context_id)
    assert (report.claimed, report.dispatched) == (1, 1)
    assert after.retry_count == 1 and after.rescanned_at is not None
    assert after.updated_at == before.updated_at  # the worker's reclaim clock (docs/rescan.md)
    assert after.statuses == ("PENDING", "PENDING")
    assert fake_worker.context_ids() == [context_id, context_id]


async def test_only_rows_whose_next_stage_is_stale_are_claimed(
    core_with_fake_worker, fake_worker, engine
):
    rows = {
        # name: (embedding, keyword, age in seconds, claimed?)
        "fresh_pending": ("PENDING", "PENDING", 200, False),
        "stale_pending": ("PENDING", "PENDING", PENDING_STALE, True),
        "young_processing": ("PROCESSING", "PENDING", 400, False),
        "stale_processing": ("PROCESSING", "PENDING", PROCESSING_STALE, True),
        "keyword_pending": ("COMPLETED", "PENDING", PENDING_STALE, True),
        "keyword_young_processing": ("COMPLETED", "PROCESSING", 400, False),
        "completed": ("COMPLETED", "COMPLETED", 10_000, False),
        "failed": ("FAILED", "FAILED", 10_000, False),
        "keyword_failed": ("COMPLETED", "FAILED", 10_000, False),
        "cancelled": ("CANCELLED", "CANCELLED", 10_000, False),
    }
    ids = {}
    for index, (name, (embedding, keyword, age, _)) in enumerate(rows.items()):
        ids[name] = await _create(core_with_fake_worker, place=f"p{index}")
        await set_statuses(
            engine, context_id=ids[name], embedding_status=embedding, keyword_status=keyword
        )
        await facts.backdate(engine, ids[name], age)

    report = await core_with_fake_worker.scheduler().run_once()

    expected = {name for name, row in rows.items() if row[3]}
    claimed = {
        name for name in rows if (await facts.state(engine, ids[name])).rescanned_at is not None
    }
    assert claimed == expected
    assert report.claimed == len(expected)


async def test_a_rescanned_row_waits_a_full_expiry_before_it_is_claimed_again(
    core_with_fake_worker, engine
):
    context_id = await _create(core_with_fake_worker)
    scheduler = core_with_fake_worker.scheduler()
    await facts.backdate(engine, context_id, PENDING_STALE)

    first = await scheduler.run_once()
    second = await scheduler.run_once()
    await facts.backdate(engine, context_id, PENDING_STALE)
    third = await scheduler.run_once()

    assert [first.claimed, second.claimed, third.claimed] == [1, 0, 1]
    assert (await facts.state(engine, context_id)).retry_count == 2


async def test_a_worker_that_always_refuses_spends_no_retry_and_fails_nothing(
    make_core, fake_worker, engine
):
    """docs/rescan.md "Budget": a refused dispatch (503) writes nothing, so a context whose
    workers stay full is re-requested again and again and never finalized. (No retry set and
    Retry-After 0 here, so that each pass sends it itself.)"""
    fake_worker.mode, fake_worker.retry_after = "refuse", "0"
    async with make_core(fake_worker.base_url, dispatch_retry_capacity=0) as core:
        context_id = await _create(core)
        scheduler, handed_back = core.scheduler(), core.app.state.dispatcher.rescan_wanted

        reports = []
        for _ in range(5):
            await asyncio.wait_for(handed_back.wait(), 5)  # the refused row was handed back
            handed_back.clear()
            await facts.backdate(engine, context_id, PENDING_STALE)
            reports.append(await scheduler.run_once())

    state = await facts.state(engine, context_id)
    assert fake_worker.context_ids() == [context_id] * 6
    assert [(r.claimed, r.dispatch_failed, r.finalized) for r in reports] == [(1, 1, 0)] * 5
    assert (state.statuses, state.retry_count) == (("PENDING", "PENDING"), 0)


async def test_four_accepted_dispatches_then_the_finalizer_fails_it(
    core_with_fake_worker, fake_worker, engine
):
    """The first accepted dispatch (the create's) is free; each later one spends one retry;
    with three spent, the finalizer fails the unfinished stages once they are stale."""
    context_id = await _create(core_with_fake_worker)  # accepted, never processed
    scheduler = core_with_fake_worker.scheduler()

    reports, counts = [], []
    for _ in range(5):
        await facts.backdate(engine, context_id, PENDING_STALE)
        reports.append(await scheduler.run_once())
        counts.append((await facts.state(engine, context_id)).retry_count)

    assert fake_worker.context_ids() == [context_id] * 4
    assert [r.claimed for r in reports] == [1, 1, 1, 0, 0]
    assert [r.dispatched for r in reports] == [1, 1, 1, 0, 0]
    assert [r.finalized for r in reports] == [0, 0, 0, 1, 0]
    assert counts == [1, 2, 3, 3, 3]
    assert (await facts.state(engine, context_id)).statuses == ("FAILED", "FAILED")


async def test_a_rejected_dispatch_counts_and_an_unauthorized_one_does_not(
    make_core, fake_worker, engine, caplog
):
    """422: the worker judged the request, so it counts; 401: our secret is wrong, a
    configuration fault: an ERROR line and the ``unauthorized`` result, nothing written."""
    from tests.fake_worker import FakeWorker
    from tests.worker.harness import serving

    fake_worker.mode = "reject"
    stranger = FakeWorker("another-internal-secret-0123456")
    async with make_core(fake_worker.base_url) as core:
        rejected = await _create(core, place="a")
        await facts.backdate(engine, rejected, PENDING_STALE)
        await core.scheduler().run_once()
        async with serving(stranger.app) as stranger_url, make_core(stranger_url) as wrong:
            refused = await _create(wrong, place="b")
            metrics = (await wrong.ops.get("/metrics")).text

    assert (await facts.state(engine, rejected)).retry_count == 1  # create free, rescan counted
    state = await facts.state(engine, refused)
    assert (state.statuses, state.retry_count) == (("PENDING", "PENDING"), 0)
    assert (
        await facts.count(
            engine,
            "SELECT count(*) FROM ai.context_ai_state WHERE context_id = :id "
            "AND dispatch_accepted_at IS NULL",
            id=refused,
        )
        == 1
    )
    assert 'pinlog_core_dispatches_total{origin="commit",result="unauthorized"} 1.0' in metrics
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert any("INTERNAL_SECRET" in r.getMessage() for r in errors)


async def test_a_timeout_after_the_request_was_sent_counts_as_taken(make_core, fake_worker, engine):
    fake_worker.mode = "hang"
    async with make_core(fake_worker.base_url, dispatch_read_timeout_seconds=0.3) as core:
        context_id = await _create(core)
        await facts.backdate(engine, context_id, PENDING_STALE)
        report = await core.scheduler().run_once()

    assert (report.claimed, report.dispatched) == (1, 1)
    assert (await facts.state(engine, context_id)).retry_count == 1


async def test_a_batch_mixing_exhausted_and_fresh_rows_never_hits_the_retry_check(
    core_with_fake_worker, engine
):
    exhausted = await _create(core_with_fake_worker, place="a")
    spendable = await _create(core_with_fake_worker, place="b")
    await set_statuses(
        engine, context_id=exhausted, embedding_status="PENDING", keyword_status="PENDING",
        retry_count=3,
    )  # fmt: skip
    for context_id in (exhausted, spendable):
        await facts.backdate(engine, context_id, PENDING_STALE)

    report = await core_with_fake_worker.scheduler().run_once()

    assert (report.finalized, report.claimed) == (1, 1)
    assert (await facts.state(engine, exhausted)).statuses == ("FAILED", "FAILED")
    assert (await facts.state(engine, spendable)).retry_count == 1


def test_a_retry_budget_above_the_schema_ceiling_is_refused_at_startup(migrated_database):
    with pytest.raises(ValidationError, match="less than or equal to 3"):
        core_settings(migrated_database, "http://127.0.0.1:1", max_retry=4)


async def test_finalizer_fails_only_unfinished_stages(core_with_fake_worker, engine):
    """Scenario 16: retry_count = 3 and stale; COMPLETED, FAILED and CANCELLED untouched."""
    cases = {
        ("COMPLETED", "PENDING", PENDING_STALE): ("COMPLETED", "FAILED"),
        ("PROCESSING", "PENDING", PROCESSING_STALE): ("FAILED", "FAILED"),
        ("COMPLETED", "PROCESSING", PROCESSING_STALE): ("COMPLETED", "FAILED"),
        ("COMPLETED", "COMPLETED", 10_000): ("COMPLETED", "COMPLETED"),
        ("CANCELLED", "CANCELLED", 10_000): ("CANCELLED", "CANCELLED"),
        ("PENDING", "PENDING", 200): ("PENDING", "PENDING"),  # exhausted but not stale yet
    }
    ids = {}
    for index, (embedding, keyword, age) in enumerate(cases):
        context_id = await _create(core_with_fake_worker, place=f"p{index}")
        await set_statuses(
            engine, context_id=context_id, embedding_status=embedding, keyword_status=keyword,
            retry_count=3,
        )  # fmt: skip
        await facts.backdate(engine, context_id, age)
        ids[(embedding, keyword, age)] = context_id

    report = await core_with_fake_worker.scheduler().run_once()

    for case, expected in cases.items():
        assert (await facts.state(engine, ids[case])).statuses == expected, case
        # Each stage the finalizer failed says retries_exhausted; no other changed.
        reasons = await failure_reasons(engine, ids[case])
        for before, after, reason in zip(case[:2], expected, reasons, strict=True):
            changed = before != after
            assert reason == ("retries_exhausted" if changed else None), case
    assert (report.finalized, report.claimed) == (3, 0)
    assert report.finalized_by_reason == {"retries_exhausted": 3, "embedding_failed": 0}


async def test_cancelled_wins_over_a_finalizer_running_meanwhile(core_with_fake_worker, engine):
    """Scenario 17: a delete holding the state row while the finalizer runs: the finalizer
    skips the locked row without waiting, and CANCELLED is never overwritten afterwards."""
    context_id = await _create(core_with_fake_worker)
    await set_statuses(
        engine, context_id=context_id, embedding_status="PENDING", keyword_status="PENDING",
        retry_count=3,
    )  # fmt: skip
    await facts.backdate(engine, context_id, PENDING_STALE)
    scheduler = core_with_fake_worker.scheduler()

    async with cancelled_in_open_transaction(engine, context_id) as delete_in_flight:
        during = await asyncio.wait_for(scheduler.run_once(), timeout=3)
        await delete_in_flight.commit()
    after = await scheduler.run_once()

    assert during.finalized == 0 and after.finalized == 0
    assert (await facts.state(engine, context_id)).statuses == ("CANCELLED", "CANCELLED")


async def test_a_delete_after_the_finalizer_still_cancels(core_with_fake_worker, engine):
    """§9 Delete: both statuses CANCELLED whatever they were, FAILED included."""
    created = await core_with_fake_worker.create(1, "메모")
    context_id, record_id = created.json()["contextId"], created.json()["recordId"]
    # The create's own dispatch and its counting first: landing after the statuses below, its
    # count moved the row out of the finalizer's reach (seen under parallel load).
    await core_with_fake_worker.app.state.dispatcher.drain(5)
    await set_statuses(
        engine, context_id=context_id, embedding_status="PENDING", keyword_status="PENDING",
        retry_count=3,
    )  # fmt: skip
    await facts.backdate(engine, context_id, PENDING_STALE)
    await core_with_fake_worker.scheduler().run_once()
    assert (await facts.state(engine, context_id)).statuses == ("FAILED", "FAILED")

    deleted = await core_with_fake_worker.client.delete(
        f"/api/v1/records/{record_id}", headers=bearer(1)
    )

    assert deleted.status_code == 204
    assert (await facts.state(engine, context_id)).statuses == ("CANCELLED", "CANCELLED")


async def test_a_keyword_stage_that_can_never_run_is_closed_at_once_and_never_dispatched(
    core_with_fake_worker, fake_worker, engine
):
    context_id = await _create(core_with_fake_worker)
    await fake_worker.wait_for_requests(1)
    await set_statuses(
        engine, context_id=context_id, embedding_status="FAILED", keyword_status="PENDING"
    )

    first = await core_with_fake_worker.scheduler().run_once()
    await facts.backdate(engine, context_id, 10_000)
    second = await core_with_fake_worker.scheduler().run_once()

    state = await facts.state(engine, context_id)
    assert (first.blocked_closed, first.claimed, second.claimed) == (1, 0, 0)
    assert (state.statuses, state.retry_count) == (("FAILED", "FAILED"), 0)
    # set_statuses wrote the embedding FAILED without a reason: a row from before 0010.
    assert await failure_reasons(engine, context_id) == (None, "embedding_failed")
    assert first.finalized_by_reason == {"retries_exhausted": 0, "embedding_failed": 1}
    assert fake_worker.context_ids() == [context_id]


@pytest.mark.serial  # a time bound that a loaded machine can miss
async def test_two_schedulers_at_once_never_double_claim_or_double_dispatch(
    core_with_fake_worker, fake_worker, engine, migrated_database
):
    context_ids = [await _create(core_with_fake_worker, place=f"p{i}") for i in range(30)]
    await fake_worker.wait_for_requests(30)
    for context_id in context_ids:
        await facts.backdate(engine, context_id, PENDING_STALE)
    settings = core_settings(migrated_database, fake_worker.base_url, batch_size=20)
    engines = [create_engine(migrated_database, pool_size=2) for _ in range(2)]
    endpoint_sets = [build_worker_endpoints(settings) for _ in range(2)]
    try:
        schedulers = [
            build_scheduler(
                settings, e, build_dispatcher(settings, e, c, CoreMetrics()), CoreMetrics()
            )
            for e, c in zip(engines, endpoint_sets, strict=True)
        ]
        rounds = [await asyncio.gather(*(s.run_once() for s in schedulers)) for _ in range(2)]
    finally:
        for endpoints in endpoint_sets:
            await endpoints.aclose()
        for each in engines:
            await each.dispose()

    assert sum(report.claimed for pair in rounds for report in pair) == 30
    assert {(await facts.state(engine, c)).retry_count for c in context_ids} == {1}
    assert sorted(fake_worker.context_ids()) == sorted(context_ids * 2)


async def test_a_deleted_context_is_skipped_and_an_inconsistent_state_is_reported(
    core_with_fake_worker, fake_worker, engine, caplog
):
    context_id = await _create(core_with_fake_worker)
    await fake_worker.wait_for_requests(1)
    async with engine.begin() as conn:  # a core row deleted without its cancellation
        await conn.execute(
            text("UPDATE core.context SET deleted_at = now() WHERE id = :id"), {"id": context_id}
        )
    await facts.backdate(engine, context_id, PENDING_STALE)

    report = await core_with_fake_worker.scheduler().run_once()

    assert (report.claimed, report.skipped_deleted, report.dispatched) == (1, 1, 0)
    assert fake_worker.context_ids() == [context_id]
    warnings = [r for r in caplog.records if r.name == "core_service.service.rescan"]
    assert any(r.levelno == logging.WARNING and "not CANCELLED" in r.getMessage() for r in warnings)


async def test_a_state_row_without_a_core_context_is_not_dispatched(
    core_with_fake_worker, fake_worker, engine
):
    await make_state(engine, context_id=9_000_001, updated_seconds_ago=PENDING_STALE)

    report = await core_with_fake_worker.scheduler().run_once()

    assert (report.claimed, report.skipped_missing, report.dispatched) == (1, 1, 0)
    assert fake_worker.requests == []
