"""One lock order across both services (docs/lock-order.md), proven with real concurrent
transactions: a lifecycle operation racing a worker's save in flight never deadlocks, never
loses the user's change and never leaves a live vector under a CANCELLED state; concurrent
lifecycle operations keep every core invariant."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from tests.core import support as facts
from tests.core.harness import bearer
from tests.worker.harness import PROFILE
from tests.worker.support import arrived, make_embedding, release, set_statuses


async def _record_with_two_contexts(core) -> tuple[int, int, int]:
    first = (await core.create(1, "첫 메모: 창가 자리 조용함")).json()
    second = (await core.create(1, "두 번째 메모: 디저트 맛있음")).json()
    return first["recordId"], first["contextId"], second["contextId"]


@pytest.mark.parametrize("operation", facts.LIFECYCLE_OPERATIONS)
async def test_lifecycle_operation_racing_a_worker_save_neither_deadlocks_nor_leaks_a_vector(
    operation, core_with_fake_worker, worker, engine, fake_openai, hold, caplog
):
    """A context re-embedded after an operational reset (its vector row exists and is live)
    while the user changes it. Interleaving: the worker's save is queued on the state row, the
    user's operation starts, then the state row frees up. The save then holds the state row and
    writes the vector row; an operation that took the vector row before the state row (the
    contract's literal delete order) deadlocks here, and PostgreSQL kills one side."""
    record_id, context_id, _other = await _record_with_two_contexts(core_with_fake_worker)
    await make_embedding(
        engine, context_id=context_id, user_id=1, record_id=record_id, profile=PROFILE
    )
    await set_statuses(  # the operational reset: COMPLETED -> PENDING (§0)
        engine, context_id=context_id, embedding_status="PENDING", keyword_status="PENDING"
    )
    held = hold()
    fake_openai.script_embeddings(held)
    processing = asyncio.create_task(
        worker.process(context_id, "첫 메모: 창가 자리 조용함", record_id=record_id)
    )
    await arrived(held)  # claimed: PROCESSING, provider call in flight

    async with engine.connect() as blocker:
        blocking = await blocker.begin()
        await blocker.execute(
            text("SELECT 1 FROM ai.context_ai_state WHERE context_id = :id FOR UPDATE"),
            {"id": context_id},
        )
        release(held)
        await facts.lock_waiters_reach(engine, 1)  # the save waits for the state row
        user_change = asyncio.create_task(
            facts.LIFECYCLE_OPERATIONS[operation](
                core_with_fake_worker.client, record_id, context_id
            )
        )
        await facts.lock_waiters_reach(engine, 2)  # and so does the user's operation
        await blocking.rollback()
        response = await asyncio.wait_for(user_change, timeout=10)
        await asyncio.wait_for(processing, timeout=10)

    assert response.status_code in (200, 204), response.text
    assert (await facts.state(engine, context_id)).statuses == ("CANCELLED", "CANCELLED")
    assert await facts.embedding_deleted(engine, context_id) is True
    assert not any((await facts.invariant_violations(engine)).values())
    assert not [r for r in caplog.records if "deadlock" in r.getMessage().lower()]
    assert not [r for r in caplog.records if r.levelno >= 30 and r.name.startswith("app.")]


async def test_twenty_concurrent_creates_for_one_place_give_one_record(
    core_with_fake_worker, engine
):
    responses = await asyncio.gather(
        *(core_with_fake_worker.create(1, f"동시 메모 {i}", place="same") for i in range(20))
    )

    statuses = sorted(r.status_code for r in responses)
    assert statuses == [200] * 19 + [201]
    assert len({r.json()["recordId"] for r in responses}) == 1
    assert len({r.json()["contextId"] for r in responses}) == 20
    assert await facts.count(engine, "SELECT count(*) FROM core.place") == 1
    assert await facts.count(engine, "SELECT count(*) FROM core.record") == 1
    assert await facts.count(engine, "SELECT count(*) FROM ai.context_ai_state") == 20


async def test_two_concurrent_modifies_leave_exactly_one_live_new_context(
    core_with_fake_worker, engine
):
    created = (await core_with_fake_worker.create(1, "원래 메모")).json()
    url = f"/api/v1/contexts/{created['contextId']}"

    responses = await asyncio.gather(
        *(
            core_with_fake_worker.client.put(url, json={"body": f"수정 {i}"}, headers=bearer(1))
            for i in range(2)
        )
    )

    assert sorted(r.status_code for r in responses) == [200, 409]
    live = await facts.count(
        engine,
        "SELECT count(*) FROM core.context WHERE record_id = :r AND deleted_at IS NULL",
        r=created["recordId"],
    )
    assert live == 1
    assert (await facts.state(engine, created["contextId"])).statuses == ("CANCELLED", "CANCELLED")


async def test_concurrent_deletes_of_a_records_two_contexts_keep_one(core_with_fake_worker, engine):
    _record_id, first, second = await _record_with_two_contexts(core_with_fake_worker)

    responses = await asyncio.gather(
        *(
            core_with_fake_worker.client.delete(f"/api/v1/contexts/{c}", headers=bearer(1))
            for c in (first, second)
        )
    )

    assert sorted(r.status_code for r in responses) == [204, 409]
    assert not any((await facts.invariant_violations(engine)).values())


@pytest.mark.parametrize("change", ["add", "modify"])
async def test_record_delete_racing_a_change_never_leaves_a_live_context(
    change, core_with_fake_worker, engine
):
    """The change either commits first and is cancelled with the record, or answers 404/409."""
    client = core_with_fake_worker.client
    outcomes = set()
    for round_number in range(8):
        created = (await core_with_fake_worker.create(1, "메모", place=f"r{round_number}")).json()
        if change == "add":
            racing = client.post(
                f"/api/v1/records/{created['recordId']}/contexts",
                json={"body": "추가"},
                headers=bearer(1),
            )
        else:
            racing = client.put(
                f"/api/v1/contexts/{created['contextId']}", json={"body": "수정"}, headers=bearer(1)
            )
        deleting = client.delete(f"/api/v1/records/{created['recordId']}", headers=bearer(1))
        change_response, delete_response = await asyncio.gather(racing, deleting)
        assert delete_response.status_code == 204
        assert change_response.status_code in (200, 201, 404, 409), change_response.text
        outcomes.add(change_response.status_code)
        assert not any((await facts.invariant_violations(engine)).values())
    assert outcomes  # every round checked the invariants


@pytest.mark.parametrize("committed_first", ["place", "place and record"])
async def test_a_create_that_meets_a_concurrent_insert_runs_step_by_step(
    committed_first, core_with_fake_worker, engine
):
    """The one-statement create cannot see a place or record committed after its snapshot
    (core_service/repository/context_writes.py): it writes nothing, then the step-by-step
    transaction finds the committed rows. One record, one place, no error."""
    core = core_with_fake_worker
    async with engine.connect() as other:
        await other.begin()
        place_id = (
            await other.execute(
                text(
                    "INSERT INTO core.place (external_place_id, name) VALUES ('raced', '먼저') "
                    "RETURNING id"
                )
            )
        ).scalar_one()
        record_id = None
        if committed_first == "place and record":
            record_id = (
                await other.execute(
                    text(
                        "INSERT INTO core.record (member_id, place_id, place_name) "
                        "VALUES (1, :p, '먼저') RETURNING id"
                    ),
                    {"p": place_id},
                )
            ).scalar_one()
        creating = asyncio.create_task(core.create(1, "늦은 메모", place="raced"))
        await facts.lock_waiters_reach(engine, 1)  # the create waits on the uncommitted place
        await other.commit()
    response = await creating

    assert response.status_code == (200 if record_id else 201), response.text
    if record_id is not None:
        assert response.json()["recordId"] == record_id
    assert await facts.count(engine, "SELECT count(*) FROM core.place") == 1
    assert await facts.count(engine, "SELECT count(*) FROM core.record") == 1
    assert await facts.count(engine, "SELECT count(*) FROM ai.context_ai_state") == 1
    step_by_step = core.app.state.metrics.registry.get_sample_value(
        "pinlog_core_create_step_by_step_total"
    )
    assert step_by_step == 1
    assert not any((await facts.invariant_violations(engine)).values())
