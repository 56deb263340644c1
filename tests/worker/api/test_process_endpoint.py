"""``POST /internal/v1/context/process`` over real HTTP (CONTRACT §3, §8, FC-11).

202 means validated and queued; 401 is decided before the body is read; 422 names the field and
queues nothing; 503 with ``Retry-After`` when the in-process queue is full.
"""

from __future__ import annotations

import json
import threading

import pytest

from tests.fake_openai import Scripted
from tests.worker.support import count_rows, fetch_state, make_state, post_raw, wait_for

BIGINT_MAX = 2**63 - 1
TEXT = "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음."
FINGERPRINTS = "ai.context_text_fingerprint"


def body(context_id: int = 1, **fields: object) -> dict[str, object]:
    values: dict[str, object] = {
        "contextId": context_id,
        "userId": 7,
        "recordId": 70,
        "text": TEXT,
        "placeMeta": {"name": "카페"},
    }
    values.update(fields)
    return values


def raw_body(**literals: str) -> str:
    """A JSON object whose values are given as literal JSON text (``recordId="1e3"``)."""
    values = {"contextId": "1", "userId": "7", "recordId": "70", "text": json.dumps(TEXT)}
    values.update(literals)
    return "{" + ", ".join(f'"{k}": {v}' for k, v in values.items() if v is not None) + "}"


async def assert_untouched(engine, worker, fake_openai, context_id: int = 1) -> None:
    """Nothing was queued for ``context_id``: after draining, no work happened at all."""
    await worker.drain()
    assert await fetch_state(engine, context_id) == ("PENDING", "PENDING")
    assert await count_rows(engine, FINGERPRINTS, context_id) == 0
    assert fake_openai.embedding_calls == 0
    assert fake_openai.judge_calls == 0


async def test_well_formed_body_is_accepted_with_202_and_the_context_completes(
    engine, worker, fake_openai
):
    await make_state(engine, context_id=1)

    response = await worker.post(body(1))
    await worker.drain()

    assert response.status_code == 202
    assert response.json() == {"contextId": 1}
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")


async def test_missing_secret_header_is_401_and_nothing_is_queued(engine, worker, fake_openai):
    await make_state(engine, context_id=1)

    response = await worker.post(body(1), secret=None)

    assert response.status_code == 401
    await assert_untouched(engine, worker, fake_openai)


async def test_wrong_secret_is_401_and_nothing_is_queued(engine, worker, fake_openai):
    await make_state(engine, context_id=1)

    response = await worker.post(body(1), secret="wrong-secret-wrong-secret-00000")

    assert response.status_code == 401
    await assert_untouched(engine, worker, fake_openai)


async def test_wrong_secret_with_invalid_body_is_401_not_422(engine, worker, fake_openai):
    await make_state(engine, context_id=1)

    response = await worker.post({"contextId": "not an id"}, secret="wrong-secret-0000000000")

    assert response.status_code == 401
    await assert_untouched(engine, worker, fake_openai)


FC11_INVALID = [
    pytest.param(raw_body(contextId=str(BIGINT_MAX + 1)), "contextId", id="contextId-2^63"),
    pytest.param(raw_body(contextId='"1"'), "contextId", id="contextId-string"),
    pytest.param(raw_body(userId="-1"), "userId", id="userId-negative"),
    pytest.param(raw_body(userId="0"), "userId", id="userId-zero"),
    pytest.param(raw_body(recordId='"42"'), "recordId", id="recordId-string"),
    pytest.param(raw_body(recordId="42.0"), "recordId", id="recordId-42.0"),
    pytest.param(raw_body(recordId="1e3"), "recordId", id="recordId-1e3"),
    pytest.param(raw_body(recordId="true"), "recordId", id="recordId-true"),
    pytest.param(raw_body(text="null"), "text", id="text-null"),
    pytest.param(raw_body(text=None), "text", id="text-missing"),
    pytest.param('{"contextId": 1, "userId": 7, ', None, id="not-json"),
]


@pytest.mark.parametrize(("raw", "field"), FC11_INVALID)
async def test_fc11_invalid_field_is_422_naming_it_and_nothing_is_queued(
    engine, worker, fake_openai, raw, field
):
    await make_state(engine, context_id=1)

    response = await post_raw(worker, raw)

    assert response.status_code == 422
    errors = response.json()["detail"]
    if field is None:  # no field to name: the body as a whole is not JSON
        assert [error["type"] for error in errors] == ["json_invalid"]
    else:
        assert [error["loc"] for error in errors] == [["body", field]]
    assert worker.app.state.pool.queued == 0
    await assert_untouched(engine, worker, fake_openai)


async def test_fc11_context_id_bigint_max_is_accepted_and_completes(engine, worker, fake_openai):
    await make_state(engine, context_id=BIGINT_MAX)

    response = await worker.post(body(BIGINT_MAX))
    await worker.drain()

    assert response.status_code == 202
    assert await fetch_state(engine, BIGINT_MAX) == ("COMPLETED", "COMPLETED")
    assert fake_openai.embedding_calls == 1


async def test_fc11_unknown_field_is_ignored_and_accepted(engine, worker, fake_openai):
    await make_state(engine, context_id=1)

    response = await worker.post(body(1, futureField={"added": "by the core side first"}))
    await worker.drain()

    assert response.status_code == 202
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")


async def test_full_queue_answers_503_with_retry_after_and_queues_nothing(
    engine, make_worker, fake_openai
):
    for context_id in (1, 2, 3):
        await make_state(engine, context_id=context_id)
    release = threading.Event()
    held = Scripted(block=release)
    fake_openai.script_embeddings(held)

    async with make_worker(queue_capacity=1, worker_concurrency=1) as worker:
        try:
            first = await worker.post(body(1))
            await wait_for(held.entered)  # the only worker is busy with context 1
            second = await worker.post(body(2))  # fills the queue
            third = await worker.post(body(3))
        finally:
            release.set()
        await worker.drain()

    assert (first.status_code, second.status_code) == (202, 202)
    assert third.status_code == 503
    assert int(third.headers["Retry-After"]) > 0
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert await fetch_state(engine, 2) == ("COMPLETED", "COMPLETED")
    assert await fetch_state(engine, 3) == ("PENDING", "PENDING")
    assert await count_rows(engine, FINGERPRINTS, 3) == 0
    assert fake_openai.embedding_calls == 2


async def test_422_body_names_the_field_but_never_echoes_the_note_text(worker):
    secret_note = "비밀 메모: 아무에게도 보여주면 안 됨"
    response = await worker.post(
        {"contextId": "1", "userId": 1, "recordId": 1, "text": secret_note}
    )

    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "contextId"]
    assert secret_note not in response.text
