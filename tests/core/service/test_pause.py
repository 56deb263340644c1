"""Pausing dispatch (docs/operations.md "Pause"): while paused, writes commit as usual, nothing
is sent, the rescan claims and spends nothing and the finalizer fails nothing; on resume the
held work goes out. A real core app on uvicorn, ``FakeWorker`` over HTTP."""

from __future__ import annotations

from core_service.operations import pause as dispatch_pause
from tests.core import support as facts
from tests.worker.harness import sample_value
from tests.worker.support import set_statuses

PENDING_STALE = 301


async def test_while_paused_nothing_is_sent_claimed_or_failed_and_resume_sends_it(
    core_with_fake_worker, fake_worker, engine
):
    core = core_with_fake_worker
    assert await dispatch_pause.change(engine, paused=True)
    created = await core.create(1, "쉬는 동안 쓴 메모", place="a")
    exhausted = (await core.create(1, "재시도 소진", place="b")).json()["contextId"]
    await set_statuses(
        engine, context_id=exhausted, embedding_status="PENDING", keyword_status="PENDING",
        retry_count=3,
    )  # fmt: skip
    await facts.backdate(engine, exhausted, PENDING_STALE)
    report = await core.scheduler().run_once()
    ready = await core.ops.get("/readyz")
    metrics = (await core.ops.get("/metrics")).text

    assert created.status_code == 201
    assert fake_worker.requests == []
    assert report.paused and (report.claimed, report.finalized) == (0, 0)
    assert (await facts.state(engine, exhausted)).statuses == ("PENDING", "PENDING")
    assert ready.status_code == 200 and ready.json()["dispatch"] == "paused"
    assert sample_value(metrics, "pinlog_core_dispatch_paused") == 1

    assert not await dispatch_pause.change(engine, paused=False)
    await fake_worker.wait_for_requests(2, timeout_seconds=5)  # the held dispatches
    resumed = await core.scheduler().run_once()

    context_id = created.json()["contextId"]
    assert sorted(fake_worker.context_ids()) == sorted([context_id, exhausted])
    assert resumed.finalized == 1  # its budget was spent before: failed once running again
    assert (await facts.state(engine, context_id)).retry_count == 0
    assert (await core.ops.get("/readyz")).json()["dispatch"] == "running"
