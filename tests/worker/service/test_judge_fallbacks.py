"""The fallback judge chain (``PINLOG_JUDGE_FALLBACKS``): a second fake provider (another real
HTTP server) is the fallback judge. It answers the same request when the first judge fails,
is unavailable or answers invalidly; ``model_profile`` names the judge that answered; the
stage ends ``judge_output_invalid`` only when every judge answered invalidly.
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from sqlalchemy import text

from app.settings import Settings
from tests.fake_openai import FakeOpenAI, Scripted, judge_body
from tests.worker.support import failure_reasons, fetch_state, make_state

NOTE = "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음."
FALLBACK_PROFILE = "openai-chat-fallback-chat-p2"
INVALID = Scripted(json=judge_body([], raw_content="not a verdict"))


@pytest.fixture(scope="module")
def second_fake():
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def fallback(second_fake):
    second_fake.reset()
    return second_fake


def _chain(fallback: FakeOpenAI, **overrides):
    return {
        "judge_fallbacks": [
            {"base_url": fallback.base_url, "model": "fallback-chat",
             "api_key_setting": "PINLOG_JUDGE_FALLBACK_1_API_KEY"}
        ],
        "judge_fallback_1_api_key": "sk-fallback-key",
        **overrides,
    }  # fmt: skip


async def _model_profile(engine, context_id: int) -> str:
    async with engine.connect() as conn:
        return (
            await conn.execute(
                text("SELECT model_profile FROM ai.context_keyword_analysis WHERE context_id = :i"),
                {"i": context_id},
            )
        ).scalar_one()


async def test_a_fallback_answers_while_the_first_judge_is_down(
    engine, make_worker, fake_openai, fallback
):
    fake_openai.set_fault("judge", Scripted(status=503))
    await make_state(engine, context_id=1)
    async with make_worker(**_chain(fallback)) as worker:
        await worker.process(1, NOTE)

    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert fake_openai.judge_calls == 1 and fallback.judge_calls == 1
    assert await _model_profile(engine, 1) == FALLBACK_PROFILE
    assert fallback.judge_requests[0]["model"] == "fallback-chat"


async def test_an_open_first_circuit_goes_straight_to_the_fallback_and_the_judge_stays_available(
    engine, make_worker, fake_openai, fallback
):
    fake_openai.set_fault("judge", Scripted(status=401))  # provider-wide: opens its circuit
    for context_id in (1, 2):
        await make_state(engine, context_id=context_id)
    async with make_worker(**_chain(fallback, breaker_threshold=1)) as worker:
        await worker.process(1, NOTE)
        await worker.process(2, NOTE)
        ready = (await worker.client.get("/readyz")).json()["providers"]["judge"]

    assert fake_openai.judge_calls == 1, "the open circuit is not called again"
    assert fallback.judge_calls == 2
    assert await fetch_state(engine, 2) == ("COMPLETED", "COMPLETED")
    assert await _model_profile(engine, 2) == FALLBACK_PROFILE
    assert ready["available"] is True


async def test_an_invalid_answer_moves_on_and_only_a_whole_chain_of_them_fails_the_stage(
    engine, make_worker, fake_openai, fallback
):
    fake_openai.set_fault("judge", INVALID)
    for context_id in (1, 2):
        await make_state(engine, context_id=context_id)
    async with make_worker(**_chain(fallback)) as worker:
        await worker.process(1, NOTE)
        first = await fetch_state(engine, 1)
        fallback.set_fault("judge", INVALID)
        await worker.process(2, NOTE)

    assert first == ("COMPLETED", "COMPLETED")
    assert await _model_profile(engine, 1) == FALLBACK_PROFILE
    assert await fetch_state(engine, 2) == ("COMPLETED", "FAILED")
    assert (await failure_reasons(engine, 2))[1] == "judge_output_invalid"


async def test_without_fallbacks_the_configured_judge_is_named(engine, make_worker, fake_openai):
    await make_state(engine, context_id=1)
    async with make_worker() as worker:
        await worker.process(1, NOTE)
    assert await _model_profile(engine, 1) == "openai-chat-fake-chat-p2"


def test_a_fallback_naming_an_unset_key_is_a_settings_error() -> None:
    with pytest.raises(ValidationError, match="PINLOG_JUDGE_FALLBACK_2_API_KEY, which is not set"):
        Settings(
            database_url="postgresql+asyncpg://u:p@localhost/d",
            internal_secret="judge-test-internal-secret-0123456789", offline=True,
            judge_fallbacks='[{"base_url": "http://x:1/v1", "model": "m", '
            '"api_key_setting": "PINLOG_JUDGE_FALLBACK_2_API_KEY"}]',
        )  # fmt: skip
