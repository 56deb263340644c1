"""§10 verification scenarios 2, 5, 6, 7, 9-15 through the running worker.

Each test drives the real pipeline (§3) against PostgreSQL and the fake OpenAI server and
asserts on the rows the core side would read: state statuses (§2), result rows (§1) and
provider call counts. Races are ordered with held provider calls, never with sleeps.
"""

from __future__ import annotations

import asyncio
import json
import logging

import numpy as np
import pytest
from sqlalchemy import text

from app.providers.hashing import hash_embed
from tests.fake_openai import Scripted, candidate_ids
from tests.worker.harness import PROFILE
from tests.worker.open_transactions import cancel_context
from tests.worker.support import (
    app_records,
    arrived,
    backdate,
    count_rows,
    fetch_state,
    keyword_rows,
    make_embedding,
    make_state,
    preset_ids,
    records_at_least,
    release,
    start_held,
    state_updated_at,
    stored_analysis,
    stored_embedding,
)

NOTE = "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음."
OTHER_NOTE = "친구들이랑 수다 떨기 좋은 넓은 술집. 단체석 있음."
JUDGE_PROFILE = "openai-chat-fake-chat-p2"
OTHER_PROFILE = "local-hashing-char-ngram-1536-cosine-v1"  # same dimension, not the worker's
EXPIRY_PLUS = 700  # seconds: older than the default 600 s PROCESSING expiry


def _body(context_id: int, note: str) -> dict:
    return {"contextId": context_id, "userId": 1, "recordId": 1, "text": note}


async def _assert_one_result_set(engine, context_id: int) -> None:
    assert await fetch_state(engine, context_id) == ("COMPLETED", "COMPLETED")
    assert await count_rows(engine, "ai.context_embedding", context_id) == 1
    assert await count_rows(engine, "ai.context_keyword", context_id) == 1  # default judge: 1
    assert await count_rows(engine, "ai.context_keyword_analysis", context_id) == 1


# --- §10 #2 ---------------------------------------------------------------------------------


async def test_scenario_02_old_context_result_arriving_after_edit_is_not_stored(
    engine, worker, fake_openai, hold
):
    """The edit (§9 modify) lands while the old context's embedding call is in flight."""
    await make_state(engine, context_id=1)
    held = hold()
    old = await start_held(worker, fake_openai.script_embeddings, held, 1, NOTE)

    await make_state(engine, context_id=2)  # the edit: new context first, then the old cancelled
    await cancel_context(engine, context_id=1)
    release(held)
    await old

    assert await stored_embedding(engine, 1) is None
    assert await fetch_state(engine, 1) == ("CANCELLED", "CANCELLED")
    assert fake_openai.judge_calls == 0
    assert await fetch_state(engine, 2) == ("PENDING", "PENDING")


# --- §10 #5 ---------------------------------------------------------------------------------


async def test_scenario_05_different_text_for_same_context_id_warns_and_resets_nothing(
    engine, worker, fake_openai, caplog
):
    await make_state(engine, context_id=1)
    await worker.process(1, NOTE)
    embedding_before = await stored_embedding(engine, 1)
    keywords_before = await keyword_rows(engine, 1)
    analysis_before = await stored_analysis(engine, 1)
    updated_before = await state_updated_at(engine, 1)
    caplog.clear()

    await worker.process(1, OTHER_NOTE)

    violations = [
        r for r in app_records(caplog, logging.WARNING) if "contract violation" in r.getMessage()
    ]
    assert len(violations) == 1
    assert fake_openai.embedding_calls == 1
    assert fake_openai.judge_calls == 1
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert await state_updated_at(engine, 1) == updated_before
    embedding_after = await stored_embedding(engine, 1)
    assert embedding_before is not None and embedding_after is not None
    assert np.array_equal(embedding_after.embedding, embedding_before.embedding)
    assert await keyword_rows(engine, 1) == keywords_before
    assert await stored_analysis(engine, 1) == analysis_before


async def test_scenario_05_contract_violation_is_detected_by_a_new_worker_instance(
    engine, worker, make_worker, fake_openai, caplog
):
    """The first text's fingerprint is persisted, so a restarted worker still notices."""
    await make_state(engine, context_id=1)
    await worker.process(1, NOTE)

    async with make_worker() as fresh:
        caplog.clear()
        await fresh.process(1, OTHER_NOTE)

    violations = [
        r for r in app_records(caplog, logging.WARNING) if "contract violation" in r.getMessage()
    ]
    assert len(violations) == 1
    assert (fake_openai.embedding_calls, fake_openai.judge_calls) == (1, 1)
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")


async def test_scenario_05_same_text_repeated_is_not_a_contract_violation(
    engine, worker, make_worker, caplog
):
    await make_state(engine, context_id=1)
    await worker.process(1, NOTE)
    await worker.process(1, NOTE)
    async with make_worker() as fresh:
        await fresh.process(1, NOTE)

    assert not [r for r in caplog.records if "contract violation" in r.getMessage()]


async def test_scenario_05_different_text_while_first_request_in_flight_warns_and_makes_no_call(
    engine, worker, fake_openai, hold, caplog
):
    """The violating request follows the normal state machine: the claim is held, so it stops."""
    await make_state(engine, context_id=1)
    held = hold()
    first = await start_held(worker, fake_openai.script_embeddings, held, 1, NOTE)

    await worker.process(1, OTHER_NOTE)
    assert not first.done()
    release(held)
    await first

    assert len([r for r in caplog.records if "contract violation" in r.getMessage()]) == 1
    assert (fake_openai.embedding_calls, fake_openai.judge_calls) == (1, 1)
    stored = await stored_embedding(engine, 1)
    assert stored is not None
    assert np.allclose(stored.embedding, hash_embed(NOTE, 1536))


# --- §10 #6 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("processed_before_edit", [True, False], ids=["completed", "pending"])
async def test_scenario_06_old_context_id_after_edit_makes_no_provider_call_and_stays_cancelled(
    engine, worker, fake_openai, processed_before_edit
):
    await make_state(engine, context_id=1)
    if processed_before_edit:
        await worker.process(1, NOTE)
    keywords_before = await keyword_rows(engine, 1)
    await make_state(engine, context_id=2)
    await cancel_context(engine, context_id=1)
    calls_before = (fake_openai.embedding_calls, fake_openai.judge_calls)

    await worker.process(1, NOTE)

    assert (fake_openai.embedding_calls, fake_openai.judge_calls) == calls_before
    assert await fetch_state(engine, 1) == ("CANCELLED", "CANCELLED")
    assert await keyword_rows(engine, 1) == keywords_before
    stored = await stored_embedding(engine, 1)
    if processed_before_edit:
        assert stored is not None and stored.is_deleted
    else:
        assert stored is None


# --- §10 #7 ---------------------------------------------------------------------------------


async def test_scenario_07_completed_embedding_with_keyword_pending_resumes_keyword_stage_only(
    engine, worker, fake_openai
):
    await make_state(engine, context_id=1, embedding_status="COMPLETED")
    await make_embedding(engine, context_id=1, embedding=hash_embed(NOTE, 1536), profile=PROFILE)

    await worker.process(1, NOTE)

    assert fake_openai.embedding_calls == 0
    assert fake_openai.judge_calls == 1
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert len(await keyword_rows(engine, 1)) == 1


async def test_scenario_07_keyword_left_processing_by_judge_503_resumes_without_embedding_call(
    engine, worker, fake_openai
):
    await make_state(engine, context_id=1)
    fake_openai.script_judge(Scripted(status=503))
    await worker.process(1, NOTE)
    assert await fetch_state(engine, 1) == ("COMPLETED", "PROCESSING")

    await backdate(engine, 1, seconds=EXPIRY_PLUS)
    await worker.process(1, NOTE)

    assert fake_openai.embedding_calls == 1
    assert fake_openai.judge_calls == 2
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert len(await keyword_rows(engine, 1)) == 1


# --- §10 #9 ---------------------------------------------------------------------------------


async def test_scenario_09_duplicate_request_during_embedding_call_makes_one_call_per_stage(
    engine, worker, fake_openai, hold, caplog
):
    await make_state(engine, context_id=1)
    held = hold()
    first = await start_held(worker, fake_openai.script_embeddings, held, 1, NOTE)

    await worker.process(1, NOTE)  # returns at once: the first request holds the claim
    assert not first.done()
    assert (fake_openai.embedding_calls, fake_openai.judge_calls) == (1, 0)
    release(held)
    await first

    assert (fake_openai.embedding_calls, fake_openai.judge_calls) == (1, 1)
    await _assert_one_result_set(engine, 1)
    assert not records_at_least(caplog, logging.WARNING)


async def test_scenario_09_duplicate_request_during_judgment_makes_one_call_per_stage(
    engine, worker, fake_openai, hold
):
    await make_state(engine, context_id=1)
    held = hold()
    first = await start_held(worker, fake_openai.script_judge, held, 1, NOTE)

    await worker.process(1, NOTE)  # embedding reused, keyword claim held by the first
    assert not first.done()
    release(held)
    await first

    assert (fake_openai.embedding_calls, fake_openai.judge_calls) == (1, 1)
    await _assert_one_result_set(engine, 1)


async def test_scenario_09_twenty_duplicate_http_requests_make_one_call_per_stage(
    engine, worker, fake_openai, hold
):
    await make_state(engine, context_id=1)
    held = hold()
    fake_openai.script_embeddings(held)

    responses = await asyncio.gather(*(worker.post(_body(1, NOTE)) for _ in range(20)))
    assert [r.status_code for r in responses] == [202] * 20
    await arrived(held)
    release(held)
    await worker.drain()

    assert (fake_openai.embedding_calls, fake_openai.judge_calls) == (1, 1)
    await _assert_one_result_set(engine, 1)


# --- §10 #10, #11, #12 ----------------------------------------------------------------------


async def test_scenario_10_delete_during_embedding_call_stores_no_embedding_and_never_judges(
    engine, worker, fake_openai, hold, caplog
):
    await make_state(engine, context_id=1)
    held = hold()
    task = await start_held(worker, fake_openai.script_embeddings, held, 1, NOTE)

    await cancel_context(engine, context_id=1)
    release(held)
    await task

    assert await stored_embedding(engine, 1) is None
    assert fake_openai.judge_calls == 0
    assert await count_rows(engine, "ai.context_keyword", 1) == 0
    assert await count_rows(engine, "ai.context_keyword_analysis", 1) == 0
    assert await fetch_state(engine, 1) == ("CANCELLED", "CANCELLED")
    assert not records_at_least(caplog, logging.WARNING)  # a discarded result is normal (§6)


async def test_scenario_11_delete_during_judgment_stores_no_keywords_and_no_analysis(
    engine, worker, fake_openai, hold
):
    await make_state(engine, context_id=1)
    held = hold()
    task = await start_held(worker, fake_openai.script_judge, held, 1, NOTE)

    await cancel_context(engine, context_id=1)
    release(held)
    await task

    assert fake_openai.judge_calls == 1
    assert await count_rows(engine, "ai.context_keyword", 1) == 0
    assert await stored_analysis(engine, 1) is None
    assert await fetch_state(engine, 1) == ("CANCELLED", "CANCELLED")
    stored = await stored_embedding(engine, 1)
    assert stored is not None and stored.is_deleted  # the worker never clears is_deleted (§0)


@pytest.mark.parametrize("cancelled", ["before_request", "during_embedding_call"])
async def test_scenario_12_cancel_before_any_embedding_row_exists_blocks_the_late_insert(
    engine, worker, fake_openai, hold, cancelled
):
    await make_state(engine, context_id=1)
    if cancelled == "before_request":
        assert await count_rows(engine, "ai.context_embedding", 1) == 0
        await cancel_context(engine, context_id=1)
        await worker.process(1, NOTE)
        assert fake_openai.embedding_calls == 0
    else:
        held = hold()
        task = await start_held(worker, fake_openai.script_embeddings, held, 1, NOTE)
        assert await count_rows(engine, "ai.context_embedding", 1) == 0
        await cancel_context(engine, context_id=1)  # marks no embedding row: none exists yet
        release(held)
        await task
        assert fake_openai.embedding_calls == 1

    assert await count_rows(engine, "ai.context_embedding", 1) == 0
    assert await fetch_state(engine, 1) == ("CANCELLED", "CANCELLED")


# --- §10 #13 --------------------------------------------------------------------------------


async def test_scenario_13_embedding_of_another_profile_stops_judgment_and_fails_keyword(
    engine, worker, fake_openai, caplog
):
    await make_state(engine, context_id=1, embedding_status="COMPLETED")
    await make_embedding(
        engine, context_id=1, embedding=hash_embed(NOTE, 1536), profile=OTHER_PROFILE
    )

    await worker.process(1, NOTE)

    assert fake_openai.judge_calls == 0
    assert fake_openai.embedding_calls == 0  # a COMPLETED vector is never regenerated (§5)
    assert await count_rows(engine, "ai.context_keyword", 1) == 0
    assert await count_rows(engine, "ai.context_keyword_analysis", 1) == 0
    assert await fetch_state(engine, 1) == ("COMPLETED", "FAILED")
    errors = app_records(caplog, logging.ERROR)
    assert len(errors) == 1
    assert "context_id=1" in errors[0].getMessage()
    assert "stage=keyword" in errors[0].getMessage()


# --- §10 #14 --------------------------------------------------------------------------------


async def test_scenario_14_zero_candidates_completes_without_judge_call_and_writes_analysis(
    engine, make_worker, fake_openai
):
    await make_state(engine, context_id=1)
    async with make_worker(keyword_similarity_floor=0.99) as worker:
        await worker.process(1, NOTE)

    assert fake_openai.judge_calls == 0
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert await count_rows(engine, "ai.context_keyword", 1) == 0
    analysis = await stored_analysis(engine, 1)
    assert analysis is not None
    assert analysis.unmatched_concepts == []
    assert analysis.model_profile == JUDGE_PROFILE


async def test_scenario_14_judge_selecting_nothing_completes_with_zero_keywords_and_analysis(
    engine, worker, fake_openai
):
    await make_state(engine, context_id=1)
    fake_openai.set_judge_selection(lambda ids: [])

    await worker.process(1, NOTE)

    assert fake_openai.judge_calls == 1
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert await count_rows(engine, "ai.context_keyword", 1) == 0
    analysis = await stored_analysis(engine, 1)
    assert analysis is not None
    assert analysis.unmatched_concepts == []
    assert analysis.model_profile == JUDGE_PROFILE


# --- §10 #15 --------------------------------------------------------------------------------

NOTES_FOR_BLOCKED = (
    NOTE,
    OTHER_NOTE,
    "비 오는 날 창밖 보면서 멍때리기 좋은 곳",
    # Written from the BLOCKED preset's own examples: it is the nearest preset of all.
    "직원 너무 불친절, 사장님 태도 최악. 서비스 별로였음. 다시는 안 감.",
)


async def _blocked_preset_id(engine) -> int:
    (blocked,) = await preset_ids(engine, "visibility = 'BLOCKED'")
    return blocked


async def _nearest_stored_preset(engine, note: str) -> int:
    """The stored preset (any visibility) nearest to ``note`` by cosine."""
    async with engine.connect() as conn:
        return (
            await conn.execute(
                text(
                    "SELECT preset_id FROM ai.keyword_preset_embedding "
                    "ORDER BY embedding <=> :q LIMIT 1"
                ),
                {"q": hash_embed(note, 1536)},
            )
        ).scalar_one()


def _offered_ids(request: dict) -> tuple[set[int], set[int]]:
    """Candidate ids of one judge request: the schema enum and the prompt's candidates."""
    prompt = json.loads(request["messages"][1]["content"])
    return set(candidate_ids(request)), {c["id"] for c in prompt["candidates"]}


async def test_scenario_15_blocked_preset_is_never_offered_even_for_a_note_matching_its_examples(
    engine, worker, fake_openai
):
    blocked = await _blocked_preset_id(engine)
    assert await _nearest_stored_preset(engine, NOTES_FOR_BLOCKED[-1]) == blocked

    for context_id, note in enumerate(NOTES_FOR_BLOCKED, start=1):
        await make_state(engine, context_id=context_id)
        await worker.process(context_id, note)

    requests = fake_openai.judge_requests
    assert len(requests) == len(NOTES_FOR_BLOCKED)
    for request in requests:
        enum_ids, prompt_ids = _offered_ids(request)
        assert enum_ids  # every note had candidates
        assert blocked not in enum_ids
        assert blocked not in prompt_ids


async def test_scenario_15_blocked_is_the_only_preset_missing_when_every_preset_qualifies(
    engine, make_worker, fake_openai, usable_preset_ids
):
    """Floor -1 and top K 100: every cached preset is a candidate, so the enum is the cache."""
    blocked = await _blocked_preset_id(engine)
    await make_state(engine, context_id=1)
    async with make_worker(keyword_similarity_floor=-1.0, keyword_top_k=100) as worker:
        await worker.process(1, NOTES_FOR_BLOCKED[-1])

    (request,) = fake_openai.judge_requests
    enum_ids, prompt_ids = _offered_ids(request)
    assert enum_ids == prompt_ids == usable_preset_ids
    assert blocked not in enum_ids


async def test_scenario_15_blocked_preset_returned_by_the_judge_anyway_is_never_stored(
    engine, worker, fake_openai
):
    blocked = await _blocked_preset_id(engine)
    fake_openai.set_judge_selection(lambda ids: [(blocked, 0.99), (ids[0], 0.8)])
    await make_state(engine, context_id=1)

    await worker.process(1, NOTES_FOR_BLOCKED[-1])

    stored = await keyword_rows(engine, 1)
    assert blocked not in stored
    assert len(stored) == 1
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
