"""Judge voting (``PINLOG_JUDGE_VOTES``): N concurrent calls to the fake provider over real
HTTP, combined by strict majority with the median confidence of the agreeing votes."""

from __future__ import annotations

import itertools
import threading

import pytest
from pydantic import ValidationError

from app.errors import ProviderUnavailableError, TransientError
from app.metrics import WorkerMetrics
from app.providers.base import JudgeCandidate, JudgeSelection
from app.providers.openai_compatible import OpenAIJudge
from app.service.judge_votes import VotingJudge
from app.settings import Settings
from tests.fake_openai import Scripted

CANDIDATES = [JudgeCandidate(i, f"k{i}", "c", "d", (), 0.5) for i in (1, 2, 3)]


def _judge(fake, votes: int) -> tuple[VotingJudge, OpenAIJudge]:
    inner = OpenAIJudge(
        base_url=fake.base_url, api_key="k", model="fake-chat", profile="openai:fake-chat",
        timeout_seconds=10, max_retries=0, metrics=WorkerMetrics(),
    )  # fmt: skip
    return VotingJudge(inner, votes), inner


def _votes(*answers):
    """A selection function answering ``answers`` in turn (any arrival order)."""
    lock, turn = threading.Lock(), itertools.count()

    def select(ids):
        with lock:
            return answers[next(turn) % len(answers)]

    return select


async def test_a_strict_majority_keeps_a_keyword_with_the_median_confidence(fake_openai):
    fake_openai.set_judge_selection(
        _votes([(1, 0.9), (2, 0.4)], [(1, 0.7), (3, 0.8)], [(1, 0.8), (2, 0.6)])
    )
    voting, inner = _judge(fake_openai, 3)
    try:
        verdict = await voting.judge("note", CANDIDATES)
    finally:
        await inner.aclose()

    assert fake_openai.judge_calls == 3
    # 1: three votes, median 0.8; 2: two of three, median of 0.4 and 0.6; 3: one vote only.
    assert verdict.selected == (JudgeSelection(1, 0.8), JudgeSelection(2, 0.5))


async def test_invalid_items_of_a_vote_are_no_votes(fake_openai):
    fake_openai.set_judge_selection(_votes([(1, 0.9), (99, 0.9)], [(1, 1.5)], [(99, 0.2)]))
    voting, inner = _judge(fake_openai, 3)
    try:
        verdict = await voting.judge("note", CANDIDATES)
    finally:
        await inner.aclose()
    assert verdict.selected == ()  # 1 has one valid vote; 99 is no candidate


async def test_a_failed_call_is_a_vote_for_nothing_while_a_majority_answered(fake_openai):
    fake_openai.script_judge(Scripted(status=503))
    fake_openai.set_judge_selection(_votes([(1, 0.9), (2, 0.3)], [(1, 0.7)]))
    voting, inner = _judge(fake_openai, 3)
    try:
        verdict = await voting.judge("note", CANDIDATES)
    finally:
        await inner.aclose()
    # Two answered: 1 has two of three votes; 2 only one.
    assert verdict.selected == (JudgeSelection(1, 0.8),)


async def test_fewer_than_a_majority_of_answers_is_transient(fake_openai):
    fake_openai.script_judge(Scripted(status=503), Scripted(status=503))
    voting, inner = _judge(fake_openai, 3)
    try:
        with pytest.raises(TransientError, match="1 of 3 calls answered"):
            await voting.judge("note", CANDIDATES)
    finally:
        await inner.aclose()


async def test_no_answer_at_all_keeps_the_classification_of_one_judge(fake_openai):
    fake_openai.set_fault("judge", Scripted(status=401))
    voting, inner = _judge(fake_openai, 3)
    try:
        with pytest.raises(ProviderUnavailableError):
            await voting.judge("note", CANDIDATES)
    finally:
        await inner.aclose()


def test_votes_must_be_odd() -> None:
    with pytest.raises(ValidationError, match="must be odd"):
        Settings(database_url="postgresql+asyncpg://u:p@localhost/d",
                 internal_secret="judge-test-internal-secret-0123456789",
                 offline=True, judge_votes=2)  # fmt: skip
    with pytest.raises(ValueError, match="odd"):
        VotingJudge(object(), 2)  # type: ignore[arg-type]
