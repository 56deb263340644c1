"""FC-08: truncated or refused structured output never replaces earlier keywords (§4, §6)."""

from __future__ import annotations

import logging

import pytest

from app.providers.hashing import hash_embed
from tests.fake_openai import Scripted, judge_body
from tests.worker.harness import PROFILE
from tests.worker.support import (
    app_records,
    fetch_state,
    keyword_rows,
    make_embedding,
    make_keyword,
    make_state,
)

NOTE = "노트북 들고 공부하기 좋은 조용한 카페, 콘센트 많음"
MODEL_OUTPUT_MARK = "zz-model-output-marker"


async def seed_reclaimable_context_with_keyword(engine, keyword_id: int) -> None:
    """Embedding done, one keyword stored by an earlier judgment, keyword stage stale."""
    await make_state(
        engine,
        context_id=1,
        embedding_status="COMPLETED",
        keyword_status="PROCESSING",
        updated_seconds_ago=3600,
    )
    await make_embedding(engine, context_id=1, embedding=hash_embed(NOTE, 1536), profile=PROFILE)
    await make_keyword(engine, context_id=1, keyword_id=keyword_id)


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (
            judge_body(
                [],
                finish_reason="length",
                raw_content='{"selected":[{"keywordId":102,"confid',
            ),
            "truncated",
        ),
        (judge_body([], refusal=f"I cannot help with that {MODEL_OUTPUT_MARK}"), "refused"),
        (
            judge_body(
                [],
                finish_reason="length",
                raw_content=('{"selected":[],"unmatchedConcepts":["' + MODEL_OUTPUT_MARK + '"]}'),
            ),
            "truncated",
        ),
    ],
    ids=["a-truncated", "b-refusal", "c-length-but-parses"],
)
async def test_fc08_bad_structured_output_keeps_earlier_keywords_and_fails_the_stage(
    engine, worker, fake_openai, usable_preset_ids, caplog, answer, reason
):
    existing = min(usable_preset_ids)
    await seed_reclaimable_context_with_keyword(engine, existing)
    fake_openai.script_judge(Scripted(json=answer))

    with caplog.at_level(logging.INFO):
        await worker.process(1, NOTE)

    assert set(await keyword_rows(engine, 1)) == {existing}
    assert await fetch_state(engine, 1) == ("COMPLETED", "FAILED")
    assert fake_openai.judge_calls == 1
    assert fake_openai.embedding_calls == 0
    errors = app_records(caplog, logging.ERROR)
    assert len(errors) == 1
    assert "context_id=1" in errors[0].getMessage()
    assert reason in errors[0].getMessage()
    assert NOTE not in caplog.text
    assert MODEL_OUTPUT_MARK not in caplog.text
