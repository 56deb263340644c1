"""Reasoning models' answers: a ``<think>…</think>`` block, or a lone reasoning
block closed by ``</think>``, before the JSON verdict is read as that verdict; a separate
``reasoning_content`` field is ignored; the reasoning is never part of the verdict."""

from __future__ import annotations

import pytest

from app.errors import InvalidOutputError, JudgeTruncatedError
from app.metrics import WorkerMetrics
from app.providers.base import JudgeCandidate, JudgeSelection
from app.providers.openai_compatible import OpenAIJudge
from tests.fake_openai import Scripted, judge_body

CANDIDATES = (
    JudgeCandidate(12, "친구와", "COMPANION", "친구와 함께한 방문", ("친구랑",), 0.6),
    JudgeCandidate(7, "조용한", "ATMOSPHERE", "조용한 분위기", ("조용해요",), 0.5),
)
REASONING = 'The note mentions a friend. {"selected": [{"keywordId": 7, "confidence": 1}]}'


@pytest.fixture
async def judge(fake):
    provider = OpenAIJudge(
        base_url=fake.base_url,
        api_key="sk-test",
        model="deepseek-r1",
        profile="openai-chat-deepseek-r1-p2",
        timeout_seconds=5.0,
        max_retries=0,
        metrics=WorkerMetrics(),
    )
    yield provider
    await provider.aclose()


@pytest.mark.parametrize(
    "body",
    [
        judge_body([(12, 0.8)], reasoning=REASONING),
        judge_body([(12, 0.8)], reasoning=REASONING, lone_reasoning=True),
        judge_body([(12, 0.8)], reasoning_content=REASONING),
        judge_body(
            [(12, 0.8)],
            raw_content=f"<think>{REASONING}</think>\n```json\n"
            '{"selected": [{"keywordId": 12, "confidence": 0.8}], "unmatchedConcepts": []}\n```',
        ),
        judge_body([(12, 0.8)], reasoning="<think>nested</think>"),
    ],
    ids=["think-block", "lone-block", "reasoning-content", "think-then-fence", "nested-tag"],
)
async def test_the_verdict_after_the_reasoning_is_read(fake, judge, body) -> None:
    fake.script_judge(Scripted(json=body))

    verdict = await judge.judge("친구랑 간 카페", CANDIDATES)

    assert verdict.selected == (JudgeSelection(12, 0.8),)
    assert fake.judge_calls == 1


async def test_a_plain_verdict_quoting_the_closing_tag_is_not_cut(fake, judge) -> None:
    fake.script_judge(Scripted(json=judge_body([(7, 0.5)], unmatched=["</think> tag"])))

    verdict = await judge.judge("메모", CANDIDATES)

    assert verdict.selected == (JudgeSelection(7, 0.5),)
    assert verdict.unmatched_concepts == ("</think> tag",)


async def test_reasoning_without_a_verdict_is_invalid_output_after_the_reask(fake, judge) -> None:
    unclosed = Scripted(json=judge_body([], raw_content=f"<think>{REASONING}"))
    fake.script_judge(unclosed, unclosed)

    with pytest.raises(InvalidOutputError):
        await judge.judge("메모", CANDIDATES)
    assert fake.judge_calls == 2


async def test_truncated_reasoning_is_truncation(fake, judge) -> None:
    fake.script_judge(
        Scripted(json=judge_body([(12, 0.8)], reasoning=REASONING, finish_reason="length"))
    )

    with pytest.raises(JudgeTruncatedError):
        await judge.judge("메모", CANDIDATES)
