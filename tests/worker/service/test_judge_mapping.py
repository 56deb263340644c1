"""Mapping the judge's answer onto stored keywords (§4), through the running worker.

The fake judge's answer is built from the candidate ids the worker actually sent (the
``keywordId`` enum of the request), so each test controls exactly which ids are inside and
outside the candidate set.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
from sqlalchemy import text

from tests.fake_openai import candidate_ids, judge_body
from tests.worker.support import (
    app_records,
    fetch_state,
    keyword_rows,
    make_state,
    preset_ids,
    release,
    start_held,
    stored_analysis,
)

NOTE = "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음."
JUDGE_PROFILE = "openai-chat-fake-chat-p2"
MISSING_PRESET_ID = 999_999


def _offered(fake_openai) -> list[int]:
    (request,) = fake_openai.judge_requests
    return candidate_ids(request)


async def test_ids_outside_the_candidate_set_are_discarded_and_the_others_stored(
    engine, worker, fake_openai, caplog
):
    every_preset = await preset_ids(engine)
    outside: list[int] = []

    def select(ids: list[int]) -> list[tuple[int, float]]:
        # A real preset that was not offered, and an id that names no preset at all.
        outside.extend([min(every_preset - set(ids)), MISSING_PRESET_ID])
        return [(ids[0], 0.8), (outside[0], 0.9), (MISSING_PRESET_ID, 0.7)]

    fake_openai.set_judge_selection(select)
    await make_state(engine, context_id=1)

    await worker.process(1, NOTE)

    offered = _offered(fake_openai)
    assert outside[0] not in offered
    assert {k: c for k, (c, _) in (await keyword_rows(engine, 1)).items()} == {offered[0]: 0.8}
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert not app_records(caplog, logging.ERROR)  # discarding is not an error (§4)


async def test_duplicate_ids_keep_the_highest_confidence(engine, worker, fake_openai):
    fake_openai.set_judge_selection(
        lambda ids: [(ids[0], 0.3), (ids[0], 0.7), (ids[1], 0.4), (ids[0], 0.5)]
    )
    await make_state(engine, context_id=1)

    await worker.process(1, NOTE)

    offered = _offered(fake_openai)
    stored = {k: c for k, (c, _) in (await keyword_rows(engine, 1)).items()}
    assert stored == {offered[0]: 0.7, offered[1]: 0.4}


async def test_confidence_outside_zero_to_one_drops_that_item_without_clamping(
    engine, worker, fake_openai
):
    fake_openai.set_judge_selection(
        lambda ids: [(ids[0], 1.5), (ids[1], -0.1), (ids[2], 0.6), (ids[3], 1.0), (ids[4], 0.0)]
    )
    await make_state(engine, context_id=1)

    await worker.process(1, NOTE)

    offered = _offered(fake_openai)
    assert len(offered) >= 5
    stored = {k: c for k, (c, _) in (await keyword_rows(engine, 1)).items()}
    assert stored == {offered[2]: 0.6, offered[3]: 1.0, offered[4]: 0.0}
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")


async def _process_with_judge_answer(
    worker, fake_openai, hold, context_id: int, note: str, answer: Callable[[list[int]], dict]
) -> list[int]:
    """Hold the judge call, build its body from the offered ids, then let it answer."""
    held = hold()
    task = await start_held(worker, fake_openai.script_judge, held, context_id, note)
    offered = candidate_ids(fake_openai.judge_requests[-1])
    held.json = answer(offered)
    release(held)
    await task
    return offered


@pytest.fixture
async def preset_list_version_7(engine, presets) -> int:
    """The stored preset list at a later revision than the first load."""
    async with engine.begin() as conn:  # as a load of version 7 leaves the list and its vectors
        await conn.execute(text("UPDATE ai.keyword_preset SET version = 7"))
        await conn.execute(text("UPDATE ai.keyword_preset_embedding SET preset_version = 7"))
    return 7


async def test_judgment_is_persisted_with_preset_version_model_profile_and_unmatched(
    engine, make_worker, fake_openai, hold, preset_list_version_7
):
    unmatched = ["주차 공간", "반려견 동반"]
    await make_state(engine, context_id=1)

    async with make_worker() as worker:
        offered = await _process_with_judge_answer(
            worker,
            fake_openai,
            hold,
            1,
            NOTE,
            lambda ids: judge_body([(ids[0], 0.812), (ids[1], 0.5)], unmatched=unmatched),
        )

    async with engine.connect() as conn:
        list_version = (
            await conn.execute(text("SELECT max(version) FROM ai.keyword_preset"))
        ).scalar_one()
    assert list_version == preset_list_version_7
    assert await keyword_rows(engine, 1) == {
        offered[0]: (0.812, list_version),
        offered[1]: (0.5, list_version),
    }
    analysis = await stored_analysis(engine, 1)
    assert analysis is not None
    assert analysis.preset_version == list_version
    assert analysis.model_profile == JUDGE_PROFILE
    assert analysis.unmatched_concepts == unmatched
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
