"""Provider faults and how each stage settles them (§6, FC-01, FC-04, FC-05).

transient -> stage left ``PROCESSING`` for the rescan; permanent -> that stage ``FAILED``,
nothing stored; a storm of permanent errors opens the circuit breaker; logs never carry keys
or note text.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tests.fake_openai import Scripted, candidate_ids, embedding_body, error_body
from tests.worker.harness import PROFILE
from tests.worker.support import (
    app_records,
    count_rows,
    fetch_state,
    keyword_rows,
    make_preset,
    make_state,
    records_at_least,
    stored_analysis,
    stored_embedding,
)

NOTE = "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음."
OTHER_NOTE = "친구들이랑 수다 떨기 좋은 넓은 술집. 단체석 있음."


async def _assert_nothing_stored(engine, context_id: int) -> None:
    assert await stored_embedding(engine, context_id) is None
    assert await count_rows(engine, "ai.context_keyword", context_id) == 0
    assert await stored_analysis(engine, context_id) is None


def _body(context_id: int, note: str) -> dict:
    return {"contextId": context_id, "userId": 1, "recordId": 1, "text": note}


# --- FC-05 ----------------------------------------------------------------------------------


async def test_fc05a_wrong_embedding_dimension_fails_embedding_stage_with_one_error_naming_both(
    engine, worker, fake_openai, caplog
):
    fake_openai.set_embedding_dimension(1024)
    await make_state(engine, context_id=1)

    await worker.process(1, NOTE)

    assert await fetch_state(engine, 1) == ("FAILED", "PENDING")
    await _assert_nothing_stored(engine, 1)
    assert fake_openai.judge_calls == 0
    (error,) = records_at_least(caplog, logging.ERROR)
    assert error.name.startswith("app.")
    assert "1024" in error.getMessage()
    assert "1536" in error.getMessage()


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param({"object": "list", "data": [], "model": "m"}, id="b-empty-data"),
        pytest.param(
            {
                "object": "list",
                "data": [{"object": "embedding", "index": 1, "embedding": [0.1] * 1536}],
                "model": "m",
            },
            id="c-index-1-for-one-input",
        ),
    ],
)
async def test_fc05bc_malformed_embedding_response_leaves_stage_processing_and_keyword_unstarted(
    engine, worker, fake_openai, payload
):
    fake_openai.script_embeddings(Scripted(json=payload))
    await make_state(engine, context_id=1)

    await worker.process(1, NOTE)

    assert await fetch_state(engine, 1) == ("PROCESSING", "PENDING")
    await _assert_nothing_stored(engine, 1)
    assert fake_openai.embedding_calls == 1  # bounded: provider_max_retries=0
    assert fake_openai.judge_calls == 0


# --- FC-01 ----------------------------------------------------------------------------------


async def test_fc01_embedding_item_without_vector_logs_one_error_and_the_worker_keeps_serving(
    engine, worker, fake_openai, caplog
):
    fake_openai.script_embeddings(
        Scripted(json={"object": "list", "data": [{"index": 0, "object": "embedding"}]})
    )
    await make_state(engine, context_id=1)
    await make_state(engine, context_id=2)

    response = await worker.post(_body(1, NOTE))
    assert response.status_code == 202
    await worker.drain()

    assert await fetch_state(engine, 1) == ("PROCESSING", "PENDING")
    await _assert_nothing_stored(engine, 1)
    assert fake_openai.judge_calls == 0
    (error,) = records_at_least(caplog, logging.ERROR)
    assert error.name.startswith("app.")
    assert "context_id=1" in error.getMessage()
    assert "stage=embedding" in error.getMessage()

    assert (await worker.post(_body(2, OTHER_NOTE))).status_code == 202
    await worker.drain()
    assert await fetch_state(engine, 2) == ("COMPLETED", "COMPLETED")
    assert fake_openai.judge_calls == 1
    assert (await worker.client.get("/healthz")).status_code == 200


# --- transient and permanent HTTP statuses --------------------------------------------------


async def test_embedding_503_leaves_processing_with_warning_and_the_next_request_takes_it_over(
    engine, worker, fake_openai, caplog
):
    """Left ``PROCESSING`` (transient); this process gave the attempt up, so its next request
    for the context takes the stage over at once rather than after the expiry
    (``app.service.abandoned_claims``; docs/state-machine.md)."""
    fake_openai.script_embeddings(Scripted(status=503))
    await make_state(engine, context_id=1)

    await worker.process(1, NOTE)

    assert await fetch_state(engine, 1) == ("PROCESSING", "PENDING")
    await _assert_nothing_stored(engine, 1)
    (warning,) = app_records(caplog, logging.WARNING)
    assert "context_id=1" in warning.getMessage()
    assert "stage=embedding" in warning.getMessage()
    assert not records_at_least(caplog, logging.ERROR)

    caplog.clear()
    await worker.process(1, NOTE)  # before the expiry

    assert fake_openai.embedding_calls == 2
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    reclaims = [r for r in app_records(caplog, logging.WARNING) if "reclaimed" in r.getMessage()]
    assert len(reclaims) == 1
    assert "context_id=1" in reclaims[0].getMessage()


async def test_judge_401_leaves_keyword_stage_processing_and_keeps_embedding_completed(
    engine, worker, fake_openai, caplog
):
    """A 401 is the provider's (the key), not the note's: keyword left ``PROCESSING`` for
    a later attempt, one ERROR line naming provider, status and the error fields."""
    fake_openai.script_judge(
        Scripted(status=401, json=error_body("Incorrect API key", code="invalid_api_key"))
    )
    await make_state(engine, context_id=1)

    await worker.process(1, NOTE)

    assert await fetch_state(engine, 1) == ("COMPLETED", "PROCESSING")
    stored = await stored_embedding(engine, 1)
    assert stored is not None and stored.profile == PROFILE
    assert await count_rows(engine, "ai.context_keyword", 1) == 0
    assert await stored_analysis(engine, 1) is None
    (error,) = app_records(caplog, logging.ERROR)
    message = error.getMessage()
    assert "stage=keyword provider=judge status=401 code=invalid_api_key" in message
    assert "type=invalid_request_error param=None reason=authentication" in message
    assert "Incorrect API key" not in caplog.text


# --- FC-04 ----------------------------------------------------------------------------------


async def test_fc04_all_zero_context_vector_fails_embedding_stage_and_judge_is_not_called(
    engine, worker, fake_openai
):
    fake_openai.script_embeddings(Scripted(json=embedding_body([np.zeros(1536)])))
    await make_state(engine, context_id=1)

    await worker.process(1, NOTE)

    assert await fetch_state(engine, 1) == ("FAILED", "PENDING")
    await _assert_nothing_stored(engine, 1)
    assert fake_openai.judge_calls == 0


async def test_fc04_stored_preset_with_all_zero_embedding_is_never_a_candidate(
    engine, make_worker, fake_openai, usable_preset_ids, caplog
):
    """Floor -1 and top K 100 make every cached preset a candidate: the enum is the cache."""
    await make_preset(engine, preset_id=900, embedding=np.zeros(1536, np.float32), profile=PROFILE)
    async with make_worker(keyword_similarity_floor=-1.0, keyword_top_k=100) as worker:
        for context_id, note in enumerate((NOTE, OTHER_NOTE), start=1):
            await make_state(engine, context_id=context_id)
            await worker.process(context_id, note)

    assert len(fake_openai.judge_requests) == 2
    for request in fake_openai.judge_requests:
        assert set(candidate_ids(request)) == usable_preset_ids - {900}
    rejected = [r for r in app_records(caplog, logging.ERROR) if "preset_id=900" in r.getMessage()]
    assert len(rejected) == 1
    for context_id in (1, 2):
        assert 900 not in await keyword_rows(engine, context_id)


# --- §6 circuit breaker ---------------------------------------------------------------------


async def test_breaker_threshold_3_stops_calls_after_3_errors_and_leaves_the_rest_processing(
    engine, make_worker, fake_openai, caplog
):
    """Five contexts against a provider answering 401; the gate opens at the third error.

    Changed on purpose (the §6 Deviation): no context ends ``FAILED`` for a provider-wide
    fault, not even the first ``threshold`` ones; every context stays ``PROCESSING`` for a
    later attempt and no call is made once open.
    """
    fake_openai.set_fault("embeddings", Scripted(status=401))
    async with make_worker(breaker_threshold=3, breaker_cooldown_seconds=600) as worker:
        for context_id in range(1, 6):
            await make_state(engine, context_id=context_id)
            await worker.process(context_id, f"{NOTE} #{context_id}")

    assert [(await fetch_state(engine, i))[0] for i in range(1, 6)] == ["PROCESSING"] * 5
    assert fake_openai.embedding_calls == 3
    assert fake_openai.judge_calls == 0
    opened = [
        r for r in app_records(caplog, logging.ERROR) if "provider unavailable" in r.getMessage()
    ]
    assert len(opened) == 1
    for context_id in range(1, 6):
        await _assert_nothing_stored(engine, context_id)


# --- §6 logs --------------------------------------------------------------------------------

PRIVATE_NOTES = (
    "zqx1 강남역 뒤 골목 비밀 아지트 카페, 사장님이 직접 로스팅",
    "zqx2 연남동 친구 자취방 근처 새벽까지 여는 포차",
    "zqx3 회사 몰래 땡땡이 치러 가는 한강 벤치",
    "zqx4 엄마 생신 때 예약했던 한정식집 룸",
    "zqx5 전 여자친구랑 마지막으로 갔던 파스타집",
)


async def test_logs_never_contain_api_keys_or_note_text_across_provider_faults(
    engine, make_worker, fake_openai, caplog
):
    fake_openai.script_embeddings(
        Scripted(status=401),  # provider-wide
        Scripted(status=503),  # transient
        Scripted(json={"object": "list", "data": [{"index": 0, "object": "embedding"}]}),
    )
    fake_openai.script_judge(Scripted(status=401))  # 4th note: embedding ok, judge rejected
    async with make_worker(breaker_threshold=1000) as worker:
        for context_id, note in enumerate(PRIVATE_NOTES, start=1):
            await make_state(engine, context_id=context_id)
            await worker.process(context_id, note)
        await make_state(engine, context_id=99)
        fake_openai.set_embedding_dimension(1024)  # wrong dimension
        await worker.process(99, PRIVATE_NOTES[0])

    assert await fetch_state(engine, 5) == ("COMPLETED", "COMPLETED")  # a healthy one too
    assert records_at_least(caplog, logging.WARNING)  # the faults were logged ...
    logged = caplog.text
    for secret in ("sk-test-embedding-key", "sk-test-judge-key"):
        assert secret not in logged
    for note in PRIVATE_NOTES:
        assert note not in logged
        assert note.split()[0] not in logged  # not even its marker word
        assert note.split()[1] not in logged
