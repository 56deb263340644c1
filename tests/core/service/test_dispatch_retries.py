"""Refused dispatches are held and sent again (docs/rescan.md "Backlog"): after the workers'
``Retry-After`` (or the backoff), in a bounded set whose overflow and leavers are handed to the
rescan through ``next_dispatch_at``; the rescan drains a backlog at the workers' pace. A real
core app on uvicorn and ``FakeWorker`` over HTTP; the rescan loop runs where a test says so."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time

import pytest

from tests.core import support as facts
from tests.worker.harness import sample_value

PENDING_STALE = 301


async def _create(core, index: int, *, member: int = 1) -> int:
    response = await core.create(member, f"메모 {index}", place=f"p{index}")
    assert response.status_code in (200, 201), response.text
    return response.json()["contextId"]


async def _due(engine, context_id: int) -> bool:
    """``next_dispatch_at`` is set: the dispatcher handed the row to the rescan."""
    return bool(
        await facts.count(
            engine,
            "SELECT count(*) FROM ai.context_ai_state "
            "WHERE context_id = :id AND next_dispatch_at IS NOT NULL",
            id=context_id,
        )
    )


async def _metric(core, name: str, **labels: str) -> float:
    exposition = (await core.ops.get("/metrics")).text
    return sample_value(exposition, name, **labels) or 0.0


async def test_a_refused_dispatch_is_sent_again_after_retry_after_and_costs_nothing(
    make_core, fake_worker, engine
):
    fake_worker.mode, fake_worker.retry_after = "refuse", "1"
    async with make_core(fake_worker.base_url) as core:
        started = time.monotonic()
        context_id = await _create(core, 1)
        await fake_worker.wait_for_requests(1)
        fake_worker.mode = "accept"
        await fake_worker.wait_for_requests(2, timeout_seconds=5)
        waited = time.monotonic() - started
        await asyncio.sleep(0.2)  # the counting statement after the 202
        retried = await _metric(
            core, "pinlog_core_dispatches_total", origin="retry", result="accepted"
        )

    assert 1.0 <= waited < 2.5  # Retry-After honoured, with at most 20 % jitter
    assert fake_worker.context_ids() == [context_id, context_id]
    assert retried == 1
    state = await facts.state(engine, context_id)
    assert (state.statuses, state.retry_count) == (("PENDING", "PENDING"), 0)
    assert state.rescanned_at is None and not await _due(engine, context_id)


async def test_without_retry_after_the_wait_starts_at_one_second_and_doubles(
    make_core, fake_worker
):
    fake_worker.mode, fake_worker.retry_after = "refuse", None
    async with make_core(fake_worker.base_url) as core:
        await _create(core, 1)
        await fake_worker.wait_for_requests(3, timeout_seconds=6)
    # ~0.8-1 s, then ~1.6-2 s between tries (the backoff with its jitter below it).
    gaps = [b - a for a, b in itertools.pairwise(fake_worker.arrival_times[:3])]
    assert 0.75 <= gaps[0] <= 1.3 and 1.55 <= gaps[1] <= 2.4, gaps


@pytest.mark.serial  # a time bound that a loaded machine can miss
async def test_while_the_workers_refuse_new_dispatches_are_held_unsent_in_owner_turns(
    make_core, fake_worker, members
):
    """After a refusal, dispatches wait without being sent; when the gate opens they go out
    round robin over owners: one member's import does not stand in front of another's."""
    fake_worker.mode, fake_worker.retry_after = "refuse", "1"
    async with make_core(fake_worker.base_url) as core:
        first = await _create(core, 0)
        await fake_worker.wait_for_requests(1)
        bulk = [await _create(core, i) for i in range(1, 9)]
        other = [await _create(core, 100 + i, member=2) for i in range(2)]
        await asyncio.sleep(0.1)
        assert len(fake_worker.requests) == 1  # held, not sent
        fake_worker.mode = "accept"
        await fake_worker.wait_for_requests(11, timeout_seconds=5)

    resent = fake_worker.context_ids()[1:]
    assert sorted(resent) == sorted([first, *bulk, *other])
    assert set(other) <= set(resent[:8])  # in the first batch (8 at once), not the last


async def test_a_full_retry_set_hands_the_rest_to_the_rescan_at_once(
    make_core, fake_worker, engine
):
    fake_worker.mode, fake_worker.retry_after = "refuse", "1"
    async with make_core(fake_worker.base_url, dispatch_retry_capacity=2) as core:
        context_ids = [await _create(core, i) for i in range(5)]
        dispatcher = core.app.state.dispatcher
        async with asyncio.timeout(5):
            await dispatcher.rescan_wanted.wait()
        let_go = await _metric(core, "pinlog_core_dispatches_let_go_total", reason="overflow")
        due = [await _due(engine, context_id) for context_id in context_ids]

    assert let_go == 3 and sum(due) == 3
    for context_id in context_ids:
        assert (await facts.state(engine, context_id)).retry_count == 0


async def test_a_held_dispatch_leaves_the_set_after_the_pending_expiry(
    make_core, fake_worker, engine
):
    fake_worker.mode, fake_worker.retry_after = "refuse", "30"
    async with make_core(fake_worker.base_url, pending_expiry_seconds=1) as core:
        context_id = await _create(core, 1)
        async with asyncio.timeout(5):
            await core.app.state.dispatcher.rescan_wanted.wait()
        let_go = await _metric(core, "pinlog_core_dispatches_let_go_total", reason="expired")

    assert let_go == 1 and await _due(engine, context_id)
    assert len(fake_worker.requests) == 1  # the gate stayed closed for the Retry-After


async def test_the_rescan_claims_a_due_row_before_its_expiry(core_with_fake_worker, engine):
    context_id = await _create(core_with_fake_worker, 1)
    await core_with_fake_worker.app.state.dispatcher.drain(5)
    scheduler = core_with_fake_worker.scheduler()
    assert (await scheduler.run_once()).claimed == 0  # fresh, not due

    async with engine.begin() as conn:
        await conn.exec_driver_sql(
            "UPDATE ai.context_ai_state SET next_dispatch_at = now() WHERE context_id = "
            f"{context_id}"
        )
    report = await scheduler.run_once()

    assert (report.claimed, report.dispatched) == (1, 1)
    assert not await _due(engine, context_id)  # the claim clears it
    assert (await scheduler.run_once()).claimed == 0  # then the expiry rule again


async def test_the_rescan_loop_drains_a_backlog_at_once_not_one_batch_per_period(
    make_core, fake_worker, engine
):
    """60 stale rows, batches of 10, a period of 5 minutes: every row is re-requested within
    seconds, one pass after another while the worker takes them."""
    async with make_core(fake_worker.base_url, batch_size=10) as core:
        context_ids = [await _create(core, i) for i in range(60)]
        await core.app.state.dispatcher.drain(5)
        for context_id in context_ids:
            await facts.backdate(engine, context_id, PENDING_STALE)
        stop = asyncio.Event()
        loop = asyncio.create_task(core.scheduler().run_forever(stop))
        try:
            await fake_worker.wait_for_requests(120, timeout_seconds=10)
        finally:
            stop.set()
            with contextlib.suppress(asyncio.CancelledError):
                await loop

    assert sorted(fake_worker.context_ids()) == sorted(context_ids * 2)
    assert {(await facts.state(engine, c)).retry_count for c in context_ids} == {1}


async def test_the_rescan_waits_for_the_workers_while_they_refuse(make_core, fake_worker, engine):
    """A pass whose dispatches are refused leaves them with the dispatcher; the next pass
    claims nothing until the set has been sent (after the Retry-After)."""
    async with make_core(fake_worker.base_url, batch_size=10) as core:
        context_ids = [await _create(core, i) for i in range(20)]
        await core.app.state.dispatcher.drain(5)
        for context_id in context_ids:
            await facts.backdate(engine, context_id, PENDING_STALE)
        fake_worker.mode, fake_worker.retry_after = "refuse", "1"
        scheduler = core.scheduler()
        first = await scheduler.run_once()
        second = await scheduler.run_once()
        fake_worker.mode = "accept"
        await core.app.state.dispatcher.wait_until_ready(5, asyncio.Event())
        third = await scheduler.run_once()

    assert (first.claimed, first.dispatched) == (10, 0)
    assert (second.claimed, second.waited_for_workers) == (0, True)
    assert third.claimed == 10
