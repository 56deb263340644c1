"""Recovery across real processes (§9 rescan and finalizer, §10 #8, #16, #17, #18): a worker
that is down, crashes with SIGKILL mid-stage or fails transiently, and ``pinlog-core rescan
--once`` run as its own process (two at once where instances race).

The tests share one worker and one core process and run in file order: the worker is stopped
by the first test, restarted by the third, killed and replaced by the last.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.core.support import embedding_deleted
from tests.e2e.conftest import CoreApi, Services
from tests.e2e.observe import (
    StateRow,
    count,
    metric,
    state,
    wait_finished,
    wait_stale,
    wait_until,
)
from tests.e2e.processes import PENDING_EXPIRY_SECONDS, PROCESSING_EXPIRY_SECONDS, rescan_once
from tests.fake_openai import Scripted
from tests.worker.support import arrived, release

NOTES = (
    "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음.",
    "친구들이랑 수다 떨기 좋은 넓은 술집. 단체석 있음.",
    "아이와 함께 가기 좋은 넓은 공원. 놀이터 있음.",
    "비 오는 날 창가 자리에서 작업했어요. 빗소리 최고.",
)
OUTCOMES = "pinlog_stage_outcomes_total"
DISPATCHES = "pinlog_core_dispatches_total"


@pytest.fixture
async def worker_down(services: Services, engine, presets, fake_openai) -> Services:
    """The services with the worker stopped: every dispatch fails to connect."""
    await services.worker.stop()
    return services


async def test_16_refused_re_requests_spend_nothing_and_the_finalizer_fails_only_the_open_stage(
    live: Services, api: CoreApi, engine, fake_openai
):
    """docs/rescan.md "Budget": re-requests the worker never received (it is down) spend no
    retry, so they never exhaust a context; a context whose budget is spent (MAX_RETRY=0 here)
    and whose open stage is stale has only that stage failed (§10 #16)."""
    dispatched = await metric(live.core.ops_base_url, DISPATCHES, origin="commit")
    fake_openai.script_judge(Scripted(status=503))  # transient: the keyword stage stays open
    _, context_id = await api.created(NOTES[0])
    await wait_until(
        lambda: _outcomes(live, "keyword", "transient", 1), what="the judge's 503 handled"
    )
    await live.worker.stop()
    # The worker is down from here on, so the rescan may use a 1 s PROCESSING expiry.
    env = live.command_env(processing_expiry_seconds=PENDING_EXPIRY_SECONDS)

    for _pass in range(2):
        await wait_stale(engine, context_id, PENDING_EXPIRY_SECONDS)
        counts = await rescan_once(env)
        assert (counts.claimed, counts.dispatched, counts.dispatch_failed) == (1, 0, 1)
        assert await state(engine, context_id) == StateRow("COMPLETED", "PROCESSING", 0)
    await wait_stale(engine, context_id, PENDING_EXPIRY_SECONDS)
    counts = await rescan_once(live.command_env(processing_expiry_seconds=1, max_retry=0))

    assert (counts.finalized, counts.claimed) == (1, 0)
    assert await state(engine, context_id) == StateRow("COMPLETED", "FAILED", 0)
    assert await embedding_deleted(engine, context_id) is False  # the finished stage kept
    assert await metric(live.core.ops_base_url, DISPATCHES, origin="commit") == dispatched + 1
    assert fake_openai.judge_calls == 1


async def _outcomes(services: Services, stage: str, outcome: str, expected: float) -> bool:
    value = await metric(services.worker.base_url, OUTCOMES, stage=stage, outcome=outcome)
    return value >= expected


async def test_17_cancelled_wins_over_the_finalizer_in_either_order(
    worker_down: Services, api: CoreApi, engine
):
    created = [await api.created(note, place=f"p{i}") for i, note in enumerate(NOTES)]
    (before, _), (after, after_context), *racing = created
    # MAX_RETRY=0: every stale row is exhausted, so this pass only finalizes.
    env = worker_down.command_env(max_retry=0)
    assert (await api.delete_record(before)).status_code == 204
    for _, context_id in created:
        await wait_stale(engine, context_id, PENDING_EXPIRY_SECONDS)

    deletes = [api.delete_record(record_id) for record_id, _ in racing]
    counts, *responses = await asyncio.gather(rescan_once(env), *deletes)
    finalized = await state(engine, after_context)
    assert (await api.delete_record(after)).status_code == 204

    assert all(response.status_code == 204 for response in responses)
    assert counts.claimed == 0
    assert 1 <= counts.finalized <= 1 + len(racing)  # never the row cancelled before it ran
    assert finalized == StateRow("FAILED", "FAILED", 0)
    for _, context_id in created:
        assert await state(engine, context_id) == StateRow("CANCELLED", "CANCELLED", 0)


async def test_failed_dispatches_stay_pending_and_two_schedulers_recover_each_exactly_once(
    worker_down: Services, api: CoreApi, engine, fake_openai
):
    """The core holds dispatches the dead worker could not take until they have waited most of
    the pending expiry (1 s here), then hands them to the rescan (docs/rescan.md "Backlog");
    this core runs none, so two ``rescan --once`` recover each once, spending nothing."""
    services = worker_down
    unreachable = await _unreachable(services)
    context_ids = []
    for i, note in enumerate(NOTES):
        started = time.monotonic()
        context_ids.append((await api.created(note, place=f"p{i}"))[1])
        assert time.monotonic() - started < 1.0  # a dead worker never slows the client
    for context_id in context_ids:
        assert await state(engine, context_id) == StateRow("PENDING", "PENDING", 0)
    await wait_until(
        lambda: _reached(_unreachable(services), unreachable + 1), what="a dispatch to fail"
    )

    await services.worker.start()
    not_claimed = await _not_claimed(services)
    for context_id in context_ids:
        await wait_stale(engine, context_id, PENDING_EXPIRY_SECONDS)
    first, second = await asyncio.gather(
        rescan_once(services.command_env()), rescan_once(services.command_env())
    )

    assert first.claimed + second.claimed == len(NOTES)
    assert first.dispatched + second.dispatched == len(NOTES)
    await wait_finished(engine, context_ids)
    for context_id in context_ids:  # the first dispatch a worker took is free
        assert await state(engine, context_id) == StateRow("COMPLETED", "COMPLETED", 0)
    embedded = [request["input"] for request in fake_openai.embedding_requests]
    for note in NOTES:
        assert sum(note in str(inputs) for inputs in embedded) == 1
    # No request reached the worker twice: it never had to refuse a claim.
    assert await _not_claimed(services) == not_claimed


async def _unreachable(services: Services) -> float:
    """After-commit dispatches the dead worker did not take: unreachable, or held unsent when
    the workers' gate was already closed by an earlier refusal (docs/rescan.md "Backlog")."""
    url = services.core.ops_base_url
    sent = await metric(url, DISPATCHES, origin="commit", result="unreachable")
    held = await metric(url, DISPATCHES, origin="commit", result="held")
    return (sent or 0) + (held or 0)


async def _reached(value, expected: float) -> bool:
    return await value >= expected


async def _not_claimed(services: Services) -> float:
    return await metric(services.worker.base_url, OUTCOMES, outcome="not_claimed")


async def test_18_context_deleted_after_the_rescan_picked_it_stores_nothing(
    live: Services, api: CoreApi, engine, fake_openai, hold
):
    discarded = await metric(live.worker.base_url, OUTCOMES, stage="embedding", outcome="discarded")
    reclaimed = hold()
    fake_openai.script_embeddings(Scripted(status=503), reclaimed)
    record_id, context_id = await api.created(NOTES[0])
    await wait_until(
        lambda: _outcomes(live, "embedding", "transient", 1), what="the embedding 503 handled"
    )
    await wait_stale(engine, context_id, PROCESSING_EXPIRY_SECONDS)

    rescan = asyncio.create_task(rescan_once(live.command_env()))
    await arrived(reclaimed)  # claimed by the rescan, reclaimed by the worker, call in flight
    assert (await api.delete_record(record_id)).status_code == 204
    release(reclaimed)
    counts = await rescan

    assert (counts.claimed, counts.dispatched) == (1, 1)
    await wait_until(
        lambda: _outcomes(live, "embedding", "discarded", discarded + 1), what="result discarded"
    )
    assert await embedding_deleted(engine, context_id) is None
    assert await state(engine, context_id) == StateRow("CANCELLED", "CANCELLED", 1)


async def test_8_worker_killed_mid_stage_is_recovered_by_the_rescan_after_the_expiry(
    live: Services, api: CoreApi, engine, fake_openai, hold
):
    judging = hold()
    fake_openai.script_judge(judging)
    _, context_id = await api.created(NOTES[1])
    await arrived(judging)
    assert await state(engine, context_id) == StateRow("COMPLETED", "PROCESSING", 0)

    await live.worker.kill()
    release(judging)  # the answer goes to a dead process
    await live.worker.start()  # a new worker on the same address; nobody asks it anything
    assert await state(engine, context_id) == StateRow("COMPLETED", "PROCESSING", 0)
    await wait_stale(engine, context_id, PROCESSING_EXPIRY_SECONDS)
    counts = await rescan_once(live.command_env())

    assert (counts.claimed, counts.dispatched) == (1, 1)
    await wait_finished(engine, [context_id])
    assert await state(engine, context_id) == StateRow("COMPLETED", "COMPLETED", 1)
    assert await metric(live.worker.base_url, "pinlog_reclaims_total", stage="keyword") == 1
    assert (fake_openai.embedding_calls, fake_openai.judge_calls) == (1, 2)  # keyword stage only
    assert await count(
        engine, "SELECT count(*) FROM ai.context_keyword_analysis WHERE context_id = :id",
        id=context_id,
    ) == 1  # fmt: skip
