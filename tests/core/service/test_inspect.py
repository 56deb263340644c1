"""``pinlog-core inspect``'s procedure against the real database: the last dispatch a worker
took, recorded by the core's counting statement (accepted, timed out after sending, or the
worker's verdict; a refusal writes nothing), and what an older row without those columns
shows ("not recorded"). The judgment read from a real worker's save is in
``tests/core/cli/test_inspect.py``."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from core_service.operations.inspect import NOT_RECORDED, report
from core_service.repository import context_inspection
from tests.e2e.observe import wait_until


async def _inspect(engine, context_id: int, *, show_text: bool = False) -> dict:
    async with engine.connect() as conn:
        row = await context_inspection.inspect(conn, context_id, with_text=show_text)
    assert row is not None
    return report(row, show_text=show_text)


async def _recorded(engine, context_id: int) -> dict:
    async def done() -> bool:
        return (await _inspect(engine, context_id))["lastDispatch"] != NOT_RECORDED

    await wait_until(done, what=f"the dispatch of context {context_id} recorded")
    return await _inspect(engine, context_id)


@pytest.mark.parametrize(
    ("mode", "outcome"), [("accept", "accepted"), ("reject", "HTTP 422"), ("hang", "timed_out")]
)
async def test_the_counting_statement_records_the_dispatchs_time_worker_and_outcome(
    make_core, fake_worker, engine, mode, outcome
):
    fake_worker.mode = mode
    async with make_core(fake_worker.base_url, dispatch_read_timeout_seconds=0.2) as core:
        created = (await core.create(1, "창가 자리 조용한 카페")).json()
        inspected = await _recorded(engine, created["contextId"])
        fake_worker.release.set()

    last = inspected["lastDispatch"]
    assert (last["worker"], last["outcome"]) == (fake_worker.base_url, outcome)
    assert last["at"] == inspected["state"]["firstDispatchTakenAt"]
    assert inspected["stages"] == {
        "embedding": {"status": "PENDING", "attempts": 0, "failure": None},
        "keyword": {"status": "PENDING", "attempts": 0, "failure": None},
    }
    assert inspected["judgment"] is None and inspected["vectors"] == []
    assert "text" not in inspected


async def test_a_refused_dispatch_records_nothing(make_core, fake_worker, engine):
    fake_worker.mode = "refuse"
    async with make_core(fake_worker.base_url) as core:
        created = (await core.create(1, "창가 자리 조용한 카페")).json()
        await fake_worker.wait_for_requests(1)
        await core.app.state.dispatcher.drain(5.0)
        inspected = await _inspect(engine, created["contextId"], show_text=True)

    assert inspected["lastDispatch"] == NOT_RECORDED
    assert inspected["state"]["firstDispatchTakenAt"] is None
    assert inspected["text"] == "창가 자리 조용한 카페"


async def test_a_judgment_saved_before_candidates_were_kept_shows_not_recorded(
    make_core, fake_worker, engine
):
    async with make_core(fake_worker.base_url) as core:
        created = (await core.create(1, "창가 자리 조용한 카페")).json()
        await core.app.state.dispatcher.drain(5.0)
    context_id = created["contextId"]
    async with engine.begin() as conn:  # as an older worker and core left the rows
        await conn.execute(
            text(
                "UPDATE ai.context_ai_state SET last_dispatch_at = NULL, "
                "last_dispatch_worker = NULL, last_dispatch_outcome = NULL WHERE context_id = :id"
            ),
            {"id": context_id},
        )
        await conn.execute(
            text(
                "INSERT INTO ai.context_keyword_analysis (context_id, preset_version, "
                "unmatched_concepts, model_profile) VALUES (:id, 3, '[\"야경\"]', 'judge-v1')"
            ),
            {"id": context_id},
        )

    inspected = await _inspect(engine, context_id)

    assert inspected["lastDispatch"] == NOT_RECORDED
    assert inspected["judgment"]["candidates"] == NOT_RECORDED
    assert inspected["judgment"]["selected"] == []
    assert (inspected["judgment"]["model"], inspected["judgment"]["presetVersion"]) == (
        "judge-v1",
        3,
    )
    assert inspected["judgment"]["unmatchedConcepts"] == ["야경"]
