"""The operational reset of a preset reclassification (§0; ``repository.keyword_reprocess``):
only live contexts whose completed judgment used an older list under the profile in use are
sent back, never a ``CANCELLED`` or ``FAILED`` row, never twice in a run; and with real
concurrent transactions, a reset racing a delete, edit, record deletion or withdrawal never
resurrects a deleted context nor leaves a live vector under ``CANCELLED``
(docs/lock-order.md)."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from core_service.repository import keyword_reprocess
from core_service.repository.db import transaction
from tests.core import support as facts
from tests.core.harness import bearer
from tests.worker.harness import PROFILE

NEW_VERSION = 2


async def _created(core, body: str, *, member: int = 1, place: str = "place-1") -> tuple[int, int]:
    response = await core.create(member, body, place=place)
    assert response.status_code in (200, 201), response.text
    return response.json()["recordId"], response.json()["contextId"]


async def _judged(engine, core, body: str, *, member: int = 1, place: str = "place-1", **kw):
    record_id, context_id = await _created(core, body, member=member, place=place)
    await facts.make_judged(
        engine,
        context_id=context_id,
        user_id=member,
        record_id=record_id,
        profile=kw.pop("profile", PROFILE),
        **kw,
    )
    return record_id, context_id


async def _stale(engine) -> list[int]:
    async with engine.connect() as conn:
        assert await keyword_reprocess.list_version(conn, PROFILE) == 0  # no presets here
        count = await keyword_reprocess.count_stale(conn, profile=PROFILE, version=NEW_VERSION)
        ids = await keyword_reprocess.select_stale(
            conn, profile=PROFILE, version=NEW_VERSION, after=0, limit=1000
        )
    assert count == len(ids)
    return ids


async def _reset(engine, context_ids) -> list[int]:
    async with transaction(engine) as conn:
        return await keyword_reprocess.reset_keyword_stages(
            conn, context_ids, profile=PROFILE, version=NEW_VERSION
        )


async def test_only_live_completed_judgments_of_an_older_list_under_the_profile_are_reset(
    engine, core_with_fake_worker
):
    core = core_with_fake_worker
    _, stale = await _judged(engine, core, "지난 목록으로 판정", preset_version=1)
    _, unanalysed = await _judged(engine, core, "분석 행 없음", place="p2", preset_version=None)
    _, current = await _judged(engine, core, "새 목록으로 판정", place="p3", preset_version=2)
    _, failed = await _judged(
        engine, core, "판정 실패", place="p4", preset_version=None, keyword_status="FAILED"
    )
    _, running = await _judged(
        engine, core, "판정 중", place="p5", preset_version=None, keyword_status="PROCESSING"
    )
    _, other_profile = await _judged(
        engine, core, "다른 프로필", place="p6", profile="other-model-1536-cosine-v1"
    )
    _, deleted = await _judged(engine, core, "지운 메모", place="p7")
    await _created(core, "남은 메모", place="p7")
    response = await core.client.delete(f"/api/v1/contexts/{deleted}", headers=bearer(1))
    assert response.status_code == 204
    _, under_deleted_record = await _judged(engine, core, "기록 삭제", place="p8")
    async with engine.begin() as conn:  # a record deleted without its state (not live anyway)
        await conn.execute(
            text(
                "UPDATE core.record SET deleted_at = now() WHERE id = "
                "(SELECT record_id FROM core.context WHERE id = :id)"
            ),
            {"id": under_deleted_record},
        )
    _, withdrawn = await _judged(engine, core, "탈퇴 회원", member=2, place="p9")
    assert (await core.client.delete("/api/v1/members/me", headers=bearer(2))).status_code == 204
    # Rows every lifecycle operation left CANCELLED in its own transaction, or that are not
    # finished judgments of an older list under the profile: the reset's own guard refuses
    # them whatever ids it is given. (Liveness itself is the selection's: a deletion always
    # cancels the state in the same transaction.)
    guarded = [stale, unanalysed, current, failed, running, other_profile, deleted, withdrawn]
    before = await facts.state_rows(engine)

    assert await _stale(engine) == [stale, unanalysed]
    assert await _reset(engine, guarded) == [stale, unanalysed]

    after = await facts.state_rows(engine)
    for context_id in (stale, unanalysed):
        state = await facts.state(engine, context_id)
        assert (state.statuses, state.retry_count) == (("COMPLETED", "PENDING"), 0)
    assert await _marker(engine, stale) == NEW_VERSION
    untouched = set(before) - {stale, unanalysed}
    assert {cid: after[cid] for cid in untouched} == {cid: before[cid] for cid in untouched}
    assert (await facts.state(engine, deleted)).statuses == ("CANCELLED", "CANCELLED")
    assert (await facts.state(engine, failed)).statuses == ("COMPLETED", "FAILED")


async def test_a_context_is_reset_at_most_once_in_a_run(engine, core_with_fake_worker):
    _, context_id = await _judged(engine, core_with_fake_worker, "한 번만", preset_version=1)
    assert await _reset(engine, await _stale(engine)) == [context_id]

    # Sent back: not a stale judgment any more, whatever the cursor.
    assert await _stale(engine) == []
    assert await _reset(engine, [context_id]) == []
    # Judged again with the new list (as the worker's keyword save leaves it): still not.
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE ai.context_ai_state SET keyword_status = 'COMPLETED' WHERE context_id = :id"
            ),
            {"id": context_id},
        )
        await conn.execute(
            text(
                "UPDATE ai.context_keyword_analysis SET preset_version = 2 WHERE context_id = :id"
            ),
            {"id": context_id},
        )
    assert await _stale(engine) == []
    assert await _reset(engine, [context_id]) == []


async def _marker(engine, context_id: int) -> int | None:
    async with engine.connect() as conn:
        return (
            await conn.execute(
                text(
                    "SELECT keyword_reprocess_version FROM ai.context_ai_state "
                    "WHERE context_id = :id"
                ),
                {"id": context_id},
            )
        ).scalar_one()


@pytest.mark.parametrize("first", ["reset", "operation"])
@pytest.mark.parametrize("operation", facts.LIFECYCLE_OPERATIONS)
async def test_a_reset_racing_a_lifecycle_operation_never_resurrects_or_leaks(
    operation, first, engine, core_with_fake_worker
):
    """Both transactions queue on the context's state row behind a blocker; whichever got in
    line first commits first. The user's change always stands: the context deleted, both
    stages ``CANCELLED``, its vector hidden; the reset moved the row only if it came first."""
    core = core_with_fake_worker
    record_id, context_id = await _judged(engine, core, "경쟁하는 메모", preset_version=1)
    await _created(core, "같은 기록의 다른 메모")  # the record keeps a live context

    async with engine.connect() as blocker:
        blocking = await blocker.begin()
        await blocker.execute(
            text("SELECT 1 FROM ai.context_ai_state WHERE context_id = :id FOR UPDATE"),
            {"id": context_id},
        )

        def reset():
            return asyncio.create_task(_reset(engine, [context_id]))

        def change():
            return asyncio.create_task(
                facts.LIFECYCLE_OPERATIONS[operation](core.client, record_id, context_id)
            )

        one = reset() if first == "reset" else change()
        await facts.lock_waiters_reach(engine, 1)
        other = change() if first == "reset" else reset()
        await facts.lock_waiters_reach(engine, 2)
        await blocking.rollback()
        done = await asyncio.wait_for(asyncio.gather(one, other), timeout=10)

    reset_ids, response = done if first == "reset" else done[::-1]
    assert response.status_code in (200, 204), response.text
    assert reset_ids == ([context_id] if first == "reset" else [])
    assert (await facts.state(engine, context_id)).statuses == ("CANCELLED", "CANCELLED")
    assert (await facts.context(engine, context_id)).deleted
    assert await facts.embedding_deleted(engine, context_id) is True
    assert not any((await facts.invariant_violations(engine)).values())
    assert await _stale(engine) == []
