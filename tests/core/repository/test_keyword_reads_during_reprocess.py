"""Keyword reads while a preset reclassification re-judges a context (§9 read rule,
Deviation): the previous keywords keep showing, still filtered by the preset's active and
visibility rules, while the keyword stage is ``PENDING``, ``PROCESSING`` or ended ``FAILED``;
never for a ``CANCELLED`` one; and a reader polling while the worker's keyword save replaces
the rows sees the previous set or the new one, never an empty one."""

from __future__ import annotations

import asyncio

from app.repository import context_ai_state as worker_states
from app.repository import stage_saves
from core_service.repository import keyword_reprocess, record_page, record_view
from core_service.repository.db import autocommit, transaction
from pinlog_platform.contract.states import Stage
from tests.core import support as facts
from tests.core.harness import bearer
from tests.worker.harness import PROFILE
from tests.worker.support import make_preset, set_statuses

OWNER, OTHER = 1, 2


async def _codes(engine, record_id: int, viewer: int) -> set[str]:
    """The owner's view by record id; another member's, the public view by public id."""
    async with autocommit(engine) as conn:
        if viewer == OWNER:
            view = await record_view.load_own(conn, viewer_id=viewer, record_id=record_id)
        else:
            public_id = await facts.public_id(engine, record_id)
            view = await record_view.load_public(conn, viewer_id=viewer, public_id=public_id)
    assert view is not None
    return {keyword.code for keyword in view.keywords}


async def _listed_codes(engine, record_id: int) -> set[str]:
    async with autocommit(engine) as conn:
        page = await record_page.list_page(conn, member_id=OWNER, after=None, limit=50)
    (summary,) = [s for s in page if s.record_id == record_id]
    return {keyword.code for keyword in summary.keywords}


async def _presets(engine) -> None:
    await make_preset(engine, preset_id=1, code="PUBLIC_ONE", profile=PROFILE)
    await make_preset(engine, preset_id=2, code="PRIVATE_ONE", visibility="PRIVATE_ONLY",
                      profile=PROFILE)  # fmt: skip
    await make_preset(engine, preset_id=3, code="RETIRED_ONE", is_active=False, profile=PROFILE)
    await make_preset(engine, preset_id=4, code="ANOTHER", profile=PROFILE)


async def _judged_record(engine, core) -> tuple[int, int]:
    response = await core.create(OWNER, "창가 자리 조용한 카페")
    record_id, context_id = response.json()["recordId"], response.json()["contextId"]
    await facts.make_judged(
        engine,
        context_id=context_id,
        user_id=OWNER,
        record_id=record_id,
        profile=PROFILE,
        preset_version=1,
        keyword_ids=(1, 2, 3),
    )
    return record_id, context_id


async def _reset(engine, context_id: int, version: int) -> list[int]:
    async with transaction(engine) as conn:
        return await keyword_reprocess.reset_keyword_stages(
            conn, [context_id], profile=PROFILE, version=version
        )


async def test_previous_keywords_show_while_re_judged_and_after_a_failed_re_judgment(
    engine, core_with_fake_worker
):
    await _presets(engine)
    record_id, context_id = await _judged_record(engine, core_with_fake_worker)
    before = (await _codes(engine, record_id, OWNER), await _codes(engine, record_id, OTHER))
    assert before == ({"PUBLIC_ONE", "PRIVATE_ONE"}, {"PUBLIC_ONE"})

    assert await _reset(engine, context_id, 2) == [context_id]
    for keyword_status in ("PENDING", "PROCESSING", "FAILED"):
        await set_statuses(
            engine, context_id=context_id, embedding_status="COMPLETED",
            keyword_status=keyword_status,
        )  # fmt: skip
        seen = (await _codes(engine, record_id, OWNER), await _codes(engine, record_id, OTHER))
        assert seen == before, keyword_status
        assert await _listed_codes(engine, record_id) == before[0], keyword_status

    # The same stage without the reprocess mark (a new context's first judgment) shows none,
    # and a deleted context shows none whatever it was.
    await set_statuses(
        engine, context_id=context_id, embedding_status="COMPLETED", keyword_status="PENDING"
    )
    response = await core_with_fake_worker.create(OWNER, "같은 곳의 두 번째 메모")
    second = response.json()["contextId"]
    await facts.make_judged(
        engine, context_id=second, user_id=OWNER, record_id=record_id, profile=PROFILE,
        preset_version=1, keyword_ids=(4,), keyword_status="PENDING",
    )  # fmt: skip
    assert "ANOTHER" not in await _codes(engine, record_id, OWNER)
    deleted = await core_with_fake_worker.client.delete(
        f"/api/v1/contexts/{context_id}", headers=bearer(OWNER)
    )
    assert deleted.status_code == 204
    assert await _codes(engine, record_id, OWNER) == set()


async def test_a_reader_never_sees_an_empty_set_while_saves_replace_the_keywords(
    engine, core_with_fake_worker, stage_pool
):
    """Twenty rounds of reset, claim and save (the core's reset and the worker's own claim
    and keyword save statements), alternating the kept keyword between two presets, while a
    reader polls the record on other connections the whole time."""
    await _presets(engine)
    record_id, context_id = await _judged_record(engine, core_with_fake_worker)
    rounds_done = asyncio.Event()
    seen: list[set[str]] = []

    async def read_until_done() -> None:
        while not rounds_done.is_set():
            seen.append(await _codes(engine, record_id, OWNER))

    async def rounds() -> None:
        try:
            for version in range(2, 22):
                assert await _reset(engine, context_id, version) == [context_id]
                claimed = await worker_states.claim(
                    stage_pool, Stage.KEYWORD, context_id, expiry_seconds=600
                )
                assert claimed.claimed
                kept = 1 if version % 2 else 4
                assert await stage_saves.save_keywords(
                    stage_pool,
                    context_id=context_id,
                    attempt=claimed.attempt,
                    selections=[(kept, 0.8)],
                    preset_version=version,
                    unmatched_concepts=[],
                    model_profile="fake-judge",
                    embedding_profile=PROFILE,
                )
                await asyncio.sleep(0)
        finally:
            rounds_done.set()

    readers = [asyncio.create_task(read_until_done()) for _ in range(3)]
    await rounds()
    await asyncio.gather(*readers)

    assert len(seen) > 20
    assert set() not in seen
    assert {frozenset(codes) for codes in seen} <= {
        frozenset({"PUBLIC_ONE", "PRIVATE_ONE"}),
        frozenset({"PUBLIC_ONE"}),
        frozenset({"ANOTHER"}),
    }
    assert await _codes(engine, record_id, OWNER) == {"PUBLIC_ONE"}
