"""Every ``FAILED`` the worker writes carries its reason code, in the same statement, and is
counted in ``pinlog_stage_failures_total{stage,reason}``."""

from __future__ import annotations

import numpy as np
import pytest

from tests.fake_openai import Scripted, embedding_body, error_body, judge_body
from tests.worker.support import failure_reasons, fetch_state, make_embedding, make_state

NOTE = "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음."


def _script(fake, endpoint: str, *answers: Scripted) -> None:
    (fake.script_embeddings if endpoint == "embeddings" else fake.script_judge)(*answers)


@pytest.mark.parametrize(
    ("text", "endpoint", "answers", "stage", "reason"),
    [
        ("\u3000\u200b", None, (), "embedding", "input_blank"),  # FC-09
        ("긴 메모 " * 3000, None, (), "embedding", "input_too_long"),  # our own length check
        (
            NOTE,
            "embeddings",
            (Scripted(status=400, json=error_body("flagged", code="invalid_prompt")),),
            "embedding",
            "input_rejected",
        ),
        (
            NOTE,
            "embeddings",
            (Scripted(json=embedding_body([np.zeros(1536)])),),
            "embedding",
            "input_rejected",
        ),  # FC-04: a zero vector for this input
        (
            NOTE,
            "embeddings",
            (Scripted(json=embedding_body([np.ones(1024)])),),
            "embedding",
            "dimension_mismatch",
        ),  # FC-05 (a)
        (
            NOTE,
            "judge",
            (Scripted(json=judge_body([], refusal="I can't help with that")),),
            "keyword",
            "judge_refused",
        ),  # FC-08 (b)
        (
            NOTE,
            "judge",
            (Scripted(json=judge_body([], raw_content='{"selected": [', finish_reason="length")),),
            "keyword",
            "judge_truncated",
        ),  # FC-08 (a)
        (
            NOTE,
            "judge",
            (Scripted(json=judge_body([], raw_content="no json")),) * 2,
            "keyword",
            "judge_output_invalid",
        ),
    ],
    ids=[
        "blank",
        "too-long",
        "provider-rejected",
        "zero-vector",
        "dimension",
        "refused",
        "truncated",
        "invalid-output",
    ],
)
async def test_each_permanent_fault_stores_its_reason(
    engine, worker, fake_openai, text, endpoint, answers, stage, reason
):
    if endpoint is not None:
        _script(fake_openai, endpoint, *answers)
    await make_state(engine, context_id=1)

    await worker.process(1, text)

    embedding, keyword = await fetch_state(engine, 1)
    reasons = await failure_reasons(engine, 1)
    if stage == "embedding":
        assert (embedding, reasons[0]) == ("FAILED", reason)
    else:
        assert (embedding, keyword, reasons) == ("COMPLETED", "FAILED", (None, reason))
    assert await worker.metric("pinlog_stage_failures_total", stage=stage, reason=reason) == 1


async def test_a_profile_mismatch_stores_profile_mismatch(engine, worker):
    await make_state(engine, context_id=1, embedding_status="COMPLETED")
    await make_embedding(engine, context_id=1, profile="another-model-1536-cosine-v9")

    await worker.process(1, NOTE)

    assert await fetch_state(engine, 1) == ("COMPLETED", "FAILED")
    assert await failure_reasons(engine, 1) == (None, "profile_mismatch")
