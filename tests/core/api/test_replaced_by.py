"""Edits point forward (§9 Modify; docs/core-service.md "Replaced contexts"): the modify
statement names the new context as the old one's replacement, and a change to a replaced
context answers 409 ``{"detail": "context was replaced", "replacedBy": ID}`` with the live end
of its replacement chain, whether each link was an edit or a ``pinlog-core retry-failed``
replacement; a chain ending in a deleted context answers "context is already deleted" naming
that last context; a context edited before the statement recorded replacements answers as
before, without ``replacedBy``. Real HTTP, real PostgreSQL, real concurrent transactions."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from core_service.operations.retry_failed import FailedReplacer, Selection
from core_service.repository.context_writes import REPLACEMENT_CHAIN_LINKS
from tests.core import support as facts
from tests.core.harness import bearer
from tests.worker.open_transactions import lock_waiters_reach
from tests.worker.support import set_statuses


async def _edit(core, context_id: int, body: str, member: int = 1):
    return await core.client.put(
        f"/api/v1/contexts/{context_id}", json={"body": body}, headers=bearer(member)
    )


async def _delete(core, context_id: int, member: int = 1):
    return await core.client.delete(f"/api/v1/contexts/{context_id}", headers=bearer(member))


async def _edited(core, context_id: int, body: str) -> int:
    response = await _edit(core, context_id, body)
    assert response.status_code == 200, response.text
    return response.json()["contextId"]


async def _answers(core, context_id: int) -> list[tuple[int, dict]]:
    """What an edit and a delete of ``context_id`` answer."""
    return [
        (r.status_code, r.json())
        for r in (await _edit(core, context_id, "또 고침"), await _delete(core, context_id))
    ]


async def test_an_edited_context_names_the_live_end_of_its_chain(core_with_fake_worker, engine):
    core = core_with_fake_worker
    first = (await core.create(1, "처음 메모")).json()["contextId"]
    second = await _edited(core, first, "두 번째")
    third = await _edited(core, second, "세 번째")

    replaced = {"detail": "context was replaced", "replacedBy": third}
    assert await _answers(core, first) == [(409, replaced)] * 2
    assert await _answers(core, second) == [(409, replaced)] * 2
    # Recorded by the modify statement itself; the live end is untouched by the 409s.
    assert (await facts.context(engine, first)).deleted
    assert (
        await facts.count(engine, "SELECT replaced_by FROM core.context WHERE id = :id", id=first)
        == second
    )
    assert not (await facts.context(engine, third)).deleted


async def test_a_retry_failed_replacement_continues_the_chain(core_with_fake_worker, engine):
    core = core_with_fake_worker
    first = (await core.create(1, "처음 메모")).json()["contextId"]
    second = await _edited(core, first, "고친 메모")
    await set_statuses(
        engine, context_id=second, embedding_status="FAILED", keyword_status="CANCELLED"
    )
    replacer = FailedReplacer(engine, core.app.state.dispatcher, core.app.state.metrics)
    report = await replacer.replace(Selection(member_id=1))
    (replacement,) = report.replaced
    assert replacement.old_id == second

    replaced = {"detail": "context was replaced", "replacedBy": replacement.new_id}
    assert await _answers(core, first) == [(409, replaced)] * 2
    assert await _answers(core, second) == [(409, replaced)] * 2


async def test_a_chain_ending_in_a_deleted_context_names_its_last_context(
    core_with_fake_worker,
):
    core = core_with_fake_worker
    created = (await core.create(1, "처음 메모")).json()
    first = created["contextId"]
    second = await _edited(core, first, "고친 메모")
    await core.client.post(  # the record keeps a live context when `second` is deleted
        f"/api/v1/records/{created['recordId']}/contexts", json={"body": "다른 메모"},
        headers=bearer(1),
    )  # fmt: skip
    assert (await _delete(core, second)).status_code == 204

    deleted = {"detail": "context is already deleted", "replacedBy": second}
    assert await _answers(core, first) == [(409, deleted)] * 2
    assert await _answers(core, second) == [(409, {"detail": "context is already deleted"})] * 2


async def test_a_context_edited_before_replacements_were_recorded_answers_as_before(
    core_with_fake_worker, engine
):
    core = core_with_fake_worker
    first = (await core.create(1, "처음 메모")).json()["contextId"]
    await _edited(core, first, "고친 메모")
    async with engine.begin() as conn:  # as an edit before this change left it
        await conn.execute(
            text("UPDATE core.context SET replaced_by = NULL WHERE id = :id"), {"id": first}
        )

    assert await _answers(core, first) == [(409, {"detail": "context is already deleted"})] * 2


async def test_a_chain_longer_than_the_bound_names_the_farthest_link_read(
    core_with_fake_worker, engine
):
    """The recursive read stops after ``REPLACEMENT_CHAIN_LINKS`` contexts; the one it names
    answers the rest of the way."""
    core = core_with_fake_worker
    created = (await core.create(1, "처음 메모")).json()
    chain = [created["contextId"]]
    async with engine.begin() as conn:  # a chain of edits, written directly for speed
        for number in range(REPLACEMENT_CHAIN_LINKS + 5):
            new_id = (
                await conn.execute(
                    text(
                        "INSERT INTO core.context (record_id, member_id, body) "
                        "VALUES (:record, 1, :body) RETURNING id"
                    ),
                    {"record": created["recordId"], "body": f"고침 {number}"},
                )
            ).scalar_one()
            await conn.execute(
                text(
                    "UPDATE core.context SET deleted_at = now(), replaced_by = :new WHERE id = :old"
                ),
                {"new": new_id, "old": chain[-1]},
            )
            chain.append(new_id)

    farthest = (await _edit(core, chain[0], "또 고침")).json()
    onward = (await _edit(core, farthest["replacedBy"], "또 고침")).json()

    assert farthest == {
        "detail": "context was replaced",
        "replacedBy": chain[REPLACEMENT_CHAIN_LINKS],
    }
    assert onward == {"detail": "context was replaced", "replacedBy": chain[-1]}


async def _held_record_lock(engine, record_id: int):
    """A transaction holding the record's row lock, as a concurrent writer would."""
    conn = await engine.connect()
    transaction = await conn.begin()
    await conn.execute(
        text("SELECT 1 FROM core.record WHERE id = :id FOR UPDATE"), {"id": record_id}
    )
    return conn, transaction


@pytest.mark.parametrize("loser", ["edit", "delete"])
async def test_a_change_that_waited_for_a_concurrent_edit_names_its_replacement(
    loser, core_with_fake_worker, engine
):
    """Both statements take their snapshot, then queue on the record's lock behind a held
    transaction, the edit first. Released, the edit commits its new context; the other,
    re-reading the old context at its lock, finds it replaced by a context its snapshot cannot
    see, and names that context."""
    core = core_with_fake_worker
    created = (await core.create(1, "처음 메모")).json()
    await core.client.post(  # a second live context: a delete is not refused as the last one
        f"/api/v1/records/{created['recordId']}/contexts", json={"body": "다른 메모"},
        headers=bearer(1),
    )  # fmt: skip
    old = created["contextId"]
    conn, transaction = await _held_record_lock(engine, created["recordId"])
    try:
        editing = asyncio.create_task(_edit(core, old, "먼저 고침"))
        await lock_waiters_reach(engine, 1)
        other = asyncio.create_task(
            _edit(core, old, "나중 고침") if loser == "edit" else _delete(core, old)
        )
        await lock_waiters_reach(engine, 2)
        await transaction.rollback()
    finally:
        await conn.close()
    edited, answered = await editing, await other

    assert edited.status_code == 200
    new_id = edited.json()["contextId"]
    assert (answered.status_code, answered.json()) == (
        409,
        {"detail": "context was replaced", "replacedBy": new_id},
    )
    live = await facts.count(
        engine,
        "SELECT count(*) FROM core.context WHERE record_id = :r AND deleted_at IS NULL",
        r=created["recordId"],
    )
    assert live == 2
    assert not any((await facts.invariant_violations(engine)).values())
