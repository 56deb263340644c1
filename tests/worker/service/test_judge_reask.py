"""Invalid judge output through the running worker (§4, §6).

An answer with no usable structure is asked again once (``pinlog_judge_reasks_total``), then
the keyword stage is ``FAILED`` with earlier keywords untouched; a fenced JSON object is read
as is; malformed items are dropped one by one and the valid ones stored. None of it opens the
circuit breaker, and no log line carries model output or note text.
"""

from __future__ import annotations

import json
import logging

from app.providers.hashing import hash_embed
from tests.fake_openai import Scripted, candidate_ids, judge_body
from tests.worker.harness import PROFILE
from tests.worker.support import (
    app_records,
    fetch_state,
    keyword_rows,
    make_embedding,
    make_keyword,
    make_state,
)

DROP_REASONS = (
    "confidence_not_a_number",
    "confidence_out_of_range",
    "duplicate",
    "id_not_an_integer",
    "unknown_id",
)
NOTE = "노트북 들고 공부하기 좋은 조용한 카페, 콘센트 많음"
MARK = "zz-model-output-marker"


def _plain(content: str) -> Scripted:
    return Scripted(json=judge_body([], raw_content=content))


async def test_plain_text_answer_is_asked_again_and_the_second_answer_is_stored(
    engine, worker, fake_openai, caplog
):
    fake_openai.script_judge(_plain(f"The note fits keyword 12. {MARK}"))
    await make_state(engine, context_id=1)

    await worker.process(1, NOTE)

    offered = candidate_ids(fake_openai.judge_requests[-1])
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert set(await keyword_rows(engine, 1)) == {offered[0]}
    assert fake_openai.judge_calls == 2
    assert await worker.metric("pinlog_judge_reasks_total") == 1
    assert not app_records(caplog, logging.ERROR)
    assert MARK not in caplog.text


async def test_still_invalid_after_the_reask_fails_the_stage_keeps_keywords_and_breaker_closed(
    engine, make_worker, fake_openai, usable_preset_ids, caplog
):
    """Breaker threshold 1: invalid output is about this answer, not the provider, so the
    next context is judged normally."""
    existing = min(usable_preset_ids)
    await make_state(
        engine,
        context_id=1,
        embedding_status="COMPLETED",
        keyword_status="PROCESSING",
        updated_seconds_ago=3600,
    )
    await make_embedding(engine, context_id=1, embedding=hash_embed(NOTE, 1536), profile=PROFILE)
    await make_keyword(engine, context_id=1, keyword_id=existing)
    await make_state(engine, context_id=2)
    fake_openai.script_judge(_plain(f"no {MARK}"), _plain(f'{{"selected": "{MARK}"}}'))

    async with make_worker(breaker_threshold=1) as worker:
        await worker.process(1, NOTE)
        await worker.process(2, NOTE)

    assert await fetch_state(engine, 1) == ("COMPLETED", "FAILED")
    assert set(await keyword_rows(engine, 1)) == {existing}
    assert await fetch_state(engine, 2) == ("COMPLETED", "COMPLETED")
    assert fake_openai.judge_calls == 3
    (error,) = app_records(caplog, logging.ERROR)
    assert "context_id=1" in error.getMessage()
    assert "cause=InvalidOutputError" in error.getMessage()
    assert "judge output invalid" in error.getMessage()
    assert MARK not in caplog.text
    assert NOTE not in caplog.text


async def test_json_object_in_a_markdown_fence_is_stored_without_a_reask(
    engine, worker, fake_openai
):
    def fenced(ids: list[int]) -> Scripted:
        answer = {"selected": [{"keywordId": ids[0], "confidence": 0.8}], "unmatchedConcepts": []}
        return _plain(f"```json\n{json.dumps(answer)}\n```")

    await make_state(engine, context_id=1)
    await make_state(engine, context_id=2)
    await worker.process(1, NOTE)  # learn which candidates this note gets
    offered = candidate_ids(fake_openai.judge_requests[-1])
    fake_openai.script_judge(fenced(offered))

    await worker.process(2, NOTE)

    assert await fetch_state(engine, 2) == ("COMPLETED", "COMPLETED")
    assert {k: c for k, (c, _) in (await keyword_rows(engine, 2)).items()} == {offered[0]: 0.8}
    assert fake_openai.judge_calls == 2
    assert await worker.metric("pinlog_judge_reasks_total") == 0


async def test_malformed_items_are_dropped_one_by_one_and_logged_as_counts_only(
    engine, worker, fake_openai, caplog
):
    fake_openai.set_judge_selection(
        lambda ids: [
            (ids[0], 0.9),
            {"keywordId": str(ids[1]), "confidence": 0.8},  # id of the wrong JSON type
            (999_999, 0.8),  # id of no candidate
            (ids[2], 1.5),  # confidence outside 0..1
            {"keywordId": ids[3], "confidence": MARK},  # confidence not a number
            (ids[0], 0.4),  # duplicate, lower
            (ids[4], 0.6),
        ]
    )
    await make_state(engine, context_id=1)

    await worker.process(1, NOTE)

    offered = candidate_ids(fake_openai.judge_requests[-1])
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    stored = {k: c for k, (c, _) in (await keyword_rows(engine, 1)).items()}
    assert stored == {offered[0]: 0.9, offered[4]: 0.6}
    (line,) = [
        r.getMessage() for r in app_records(caplog, logging.INFO) if "dropped" in r.getMessage()
    ]
    assert line == (
        "judge items dropped: context_id=1 confidence_not_a_number=1 "
        "confidence_out_of_range=1 duplicate=1 id_not_an_integer=1 unknown_id=1"
    )
    for reason in DROP_REASONS:
        dropped = await worker.metric("pinlog_judge_items_dropped_total", reason=reason)
        assert dropped == 1, reason
    assert MARK not in caplog.text
    assert not app_records(caplog, logging.ERROR)
