"""Text normalisation at the API boundary (CONTRACT §3, §6, FC-09, FC-10).

Blank, invisible, unencodable or too-long text is well-formed JSON, so it is accepted (202) and
then fails the embedding stage permanently in one pass without any provider call. NFD Hangul
reaches both providers as NFC.
"""

from __future__ import annotations

import json
import logging
import unicodedata

import pytest

from tests.worker.harness import PROCESS_PATH, SECRET
from tests.worker.support import fetch_state, make_state, post_raw

JAMO = range(0x1100, 0x1200)  # conjoining Hangul jamo: only present in decomposed text


def body(context_id: int, text: str) -> dict[str, object]:
    return {"contextId": context_id, "userId": 7, "recordId": 70, "text": text}


def app_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("app") and r.levelno == level]


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("   \n\t", id="ascii-whitespace"),
        pytest.param("\u3000\u3000", id="ideographic-space"),
        pytest.param("\u200b\u200b", id="zero-width-space"),
        pytest.param("\ufeff\u200b \u00a0", id="bom-zwsp-nbsp"),
        pytest.param("\u3164", id="hangul-filler"),
    ],
)
async def test_fc09_blank_text_is_202_then_embedding_failed_once_without_provider_calls(
    engine, worker, fake_openai, caplog, text
):
    await make_state(engine, context_id=1)

    response = await worker.post(body(1, text))
    await worker.drain()

    assert response.status_code == 202
    assert (await fetch_state(engine, 1))[0] == "FAILED"
    assert (fake_openai.embedding_calls, fake_openai.judge_calls) == (0, 0)
    warnings = app_records(caplog, logging.WARNING)
    assert len(warnings) == 1
    assert "context_id=1" in warnings[0].getMessage()
    assert app_records(caplog, logging.ERROR) == []


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("가" * 6001, id="over-long"),
        pytest.param("a\u0000b", id="nul"),
        pytest.param("a\ud800b", id="lone-surrogate"),
    ],
)
async def test_invalid_input_is_one_warning_from_the_stage_failure_module_never_an_error(
    engine, worker, fake_openai, caplog, text
):
    """§6 and docs/failures.md: invalid input (over-long, unencodable, like FC-09's blank
    text) is the caller's, not ours: ``FAILED`` in one pass, one WARNING, no ERROR, logged by
    the module that applies the rule (``__name__``), never with the text."""
    await make_state(engine, context_id=1)

    response = await worker.client.post(
        PROCESS_PATH,
        content=json.dumps(body(1, text)),  # ASCII escapes carry the lone surrogate
        headers={"X-Internal-Secret": SECRET, "Content-Type": "application/json"},
    )
    await worker.drain()

    assert response.status_code == 202
    assert await fetch_state(engine, 1) == ("FAILED", "PENDING")
    assert (fake_openai.embedding_calls, fake_openai.judge_calls) == (0, 0)
    (warning,) = app_records(caplog, logging.WARNING)
    assert warning.name == "app.service.stage_failure"
    assert "context_id=1" in warning.getMessage()
    assert "cause=InvalidInputError" in warning.getMessage()
    assert app_records(caplog, logging.ERROR) == []
    assert "가가가" not in caplog.text


async def test_fc09_hangul_filler_before_real_text_is_processed_normally(
    engine, worker, fake_openai
):
    await make_state(engine, context_id=1)

    response = await worker.post(body(1, "\u3164메모"))
    await worker.drain()

    assert response.status_code == 202
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert [request["input"] for request in fake_openai.embedding_requests] == [["메모"]]


@pytest.mark.parametrize(
    "escaped_text",
    [pytest.param(r"\ud800", id="lone-surrogate"), pytest.param(r"\u0000", id="nul")],
)
async def test_unencodable_text_is_202_then_embedding_failed_without_provider_calls(
    engine, worker, fake_openai, escaped_text
):
    await make_state(engine, context_id=1)
    raw = '{"contextId": 1, "userId": 7, "recordId": 70, "text": "메모 ' + escaped_text + '"}'

    response = await post_raw(worker, raw)
    await worker.drain()

    assert response.status_code == 202
    assert (await fetch_state(engine, 1))[0] == "FAILED"
    assert (fake_openai.embedding_calls, fake_openai.judge_calls) == (0, 0)


async def test_text_longer_than_the_input_limit_fails_embedding_without_provider_calls(
    engine, make_worker, fake_openai
):
    await make_state(engine, context_id=1)

    async with make_worker(embedding_max_input_chars=10) as worker:
        response = await worker.post(body(1, "조용한 카페, 콘센트 많음"))
        await worker.drain()

    assert response.status_code == 202
    assert (await fetch_state(engine, 1))[0] == "FAILED"
    assert (fake_openai.embedding_calls, fake_openai.judge_calls) == (0, 0)


async def test_fc10_nfd_and_nfc_notes_reach_both_providers_as_identical_nfc(
    engine, worker, fake_openai
):
    nfc = "성수동 조용한 카페에서 👩‍💻 coding at Café Noir, Wi-Fi OK ☕️"
    nfd = unicodedata.normalize("NFD", nfc)
    assert nfd != nfc and unicodedata.is_normalized("NFC", nfc)
    await make_state(engine, context_id=1)
    await make_state(engine, context_id=2)

    assert (await worker.post(body(1, nfd))).status_code == 202
    assert (await worker.post(body(2, nfc))).status_code == 202
    await worker.drain()

    # Concurrent stages may share one batched request: compare the inputs, not the requests.
    embedded = [text for request in fake_openai.embedding_requests for text in request["input"]]
    assert embedded == [nfc, nfc]
    assert {text.encode("utf-8") for text in embedded} == {nfc.encode("utf-8")}
    assert fake_openai.judge_calls == 2
    for request in fake_openai.judge_requests:
        prompt = "".join(message["content"] for message in request["messages"])
        assert not any(ord(char) in JAMO for char in prompt)
        note = json.loads(request["messages"][-1]["content"])["note"]
        assert note == nfc  # emoji (ZWJ, variation selector) and Latin text unchanged
