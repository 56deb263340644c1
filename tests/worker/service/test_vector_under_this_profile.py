"""The keyword stage after a profile cutover (docs/contract.md §1, Deviation "vectors per
profile"): a context whose embedding stage is ``COMPLETED`` under another profile and whose
keyword stage is still to run gets a vector under this worker's profile first
(``EmbeddingStage._embed_under_this_profile``, ``profile_vectors.SAVE_PROFILE_VECTOR``),
without touching the live embedding stage; a cancellation that commits first wins.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from sqlalchemy import text

from app.providers.hashing import hash_embed
from app.repository import profile_vectors
from app.repository.db import to_array
from tests.fake_openai import Scripted
from tests.worker.harness import PROCESS_PATH, PROFILE, SECRET
from tests.worker.support import (
    cancel_context,
    count_rows,
    fetch_state,
    make_embedding,
    make_state,
    release,
    start_held,
    vector,
)

# Another model's vectors, of another dimension (0060: the column declares none).
OTHER_PROFILE = "old-model-768-cosine-v1"
OTHER_DIMENSION = 768
DIMENSION = 1536
NOTE = "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음."
LOCK_WAITERS = text(
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
)


async def embedded_before_the_cutover(engine, context_id: int, *, keyword_status: str) -> None:
    """Embedding COMPLETED under the old profile only; the keyword stage as given."""
    await make_state(
        engine, context_id=context_id, embedding_status="COMPLETED", keyword_status=keyword_status
    )
    await make_embedding(
        engine,
        context_id=context_id,
        profile=OTHER_PROFILE,
        embedding=vector("old", dimension=OTHER_DIMENSION),
    )


async def state_row(engine, context_id: int) -> dict[str, Any]:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text("SELECT * FROM ai.context_ai_state WHERE context_id = :id"),
                {"id": context_id},
            )
        ).one()
    return dict(row._mapping)


async def vectors_by_profile(engine, context_id: int) -> dict[str, np.ndarray]:
    async with engine.connect() as conn:
        rows = (
            await conn.execute(
                text(
                    "SELECT embedding_profile, embedding FROM ai.context_embedding "
                    "WHERE context_id = :id"
                ),
                {"id": context_id},
            )
        ).all()
    return {row.embedding_profile: to_array(row.embedding) for row in rows}


async def analysis_profile(engine, context_id: int) -> str | None:
    """``embedding_profile`` of the context's analysis row (which must exist)."""
    async with engine.connect() as conn:
        return (
            await conn.execute(
                text(
                    "SELECT embedding_profile FROM ai.context_keyword_analysis "
                    "WHERE context_id = :id"
                ),
                {"id": context_id},
            )
        ).scalar_one()


def assert_old_vector_kept(vectors: dict[str, np.ndarray]) -> None:
    np.testing.assert_array_equal(vectors[OTHER_PROFILE], vector("old", dimension=OTHER_DIMENSION))


async def test_the_keyword_stage_after_a_cutover_gets_a_vector_of_this_profile_and_completes(
    engine, worker, fake_openai
):
    await embedded_before_the_cutover(engine, 1, keyword_status="PENDING")
    before = await state_row(engine, 1)

    response = await worker.client.post(
        PROCESS_PATH,
        json={
            "contextId": 1,
            "userId": 7,
            "recordId": 70,
            "text": NOTE,
            "embeddingProfile": PROFILE,
        },
        headers={"X-Internal-Secret": SECRET},
    )
    await worker.drain()

    assert response.status_code == 202
    vectors = await vectors_by_profile(engine, 1)
    assert set(vectors) == {PROFILE, OTHER_PROFILE}
    assert vectors[PROFILE].shape == (DIMENSION,)
    np.testing.assert_allclose(vectors[PROFILE], hash_embed(NOTE, DIMENSION), atol=1e-6)
    assert_old_vector_kept(vectors)
    after = await state_row(engine, 1)
    # The live embedding stage is untouched; the keyword stage ran once and completed.
    assert (after["embedding_status"], after["embedding_attempt"]) == (
        before["embedding_status"],
        before["embedding_attempt"],
    )
    assert (after["keyword_status"], after["keyword_attempt"]) == ("COMPLETED", 1)
    assert await analysis_profile(engine, 1) == PROFILE
    assert fake_openai.embedding_calls == 1
    assert fake_openai.judge_calls == 1
    assert fake_openai.embedding_requests[0]["input"] == [NOTE]


async def test_the_stored_vector_is_reused_by_the_next_judgment(engine, worker, fake_openai):
    await embedded_before_the_cutover(engine, 1, keyword_status="PENDING")
    await worker.process(1, NOTE)
    assert fake_openai.embedding_calls == 1
    # A re-judgment (keyword stage back to PENDING, as `reprocess keywords` leaves it).
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE ai.context_ai_state SET keyword_status = 'PENDING' WHERE context_id = 1")
        )

    await worker.process(1, NOTE)

    assert fake_openai.embedding_calls == 1  # the vector of this profile is read, not made
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert await analysis_profile(engine, 1) == PROFILE


async def test_a_context_with_nothing_to_judge_gets_no_vector(engine, worker, fake_openai):
    await embedded_before_the_cutover(engine, 1, keyword_status="COMPLETED")

    await worker.process(1, NOTE)

    assert set(await vectors_by_profile(engine, 1)) == {OTHER_PROFILE}
    assert (fake_openai.embedding_calls, fake_openai.judge_calls) == (0, 0)


async def test_a_delete_during_the_provider_call_wins_and_stores_nothing(
    engine, worker, fake_openai, hold
):
    await embedded_before_the_cutover(engine, 1, keyword_status="PENDING")
    held = hold()
    task = await start_held(worker, fake_openai.script_embeddings, held, 1, NOTE)

    await cancel_context(engine, context_id=1)
    release(held)
    await task

    assert set(await vectors_by_profile(engine, 1)) == {OTHER_PROFILE}
    assert await fetch_state(engine, 1) == ("CANCELLED", "CANCELLED")
    assert await count_rows(engine, "ai.context_keyword_analysis", 1) == 0
    assert fake_openai.judge_calls == 0


async def test_a_provider_fault_leaves_both_stages_as_they_were_for_the_rescan(
    engine, worker, fake_openai
):
    await embedded_before_the_cutover(engine, 1, keyword_status="PENDING")
    before = await state_row(engine, 1)
    fake_openai.set_fault("embeddings", Scripted(status=500))

    await worker.process(1, NOTE)

    assert set(await vectors_by_profile(engine, 1)) == {OTHER_PROFILE}
    after = await state_row(engine, 1)
    assert {k: after[k] for k in ("embedding_status", "keyword_status", "keyword_attempt")} == {
        "embedding_status": "COMPLETED",
        "keyword_status": "PENDING",
        "keyword_attempt": before["keyword_attempt"],
    }
    assert fake_openai.judge_calls == 0

    # The rescan's next request finds the provider back and completes.
    fake_openai.set_fault("embeddings", None)
    await worker.process(1, NOTE)
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert set(await vectors_by_profile(engine, 1)) == {PROFILE, OTHER_PROFILE}


# --------------------------------------------------------------------------- the statement


async def save_profile_vector(stage_pool, context_id: int = 1) -> bool:
    return await profile_vectors.save_profile_vector(
        stage_pool,
        context_id=context_id,
        user_id=7,
        record_id=70,
        embedding=vector("this profile"),
        embedding_profile=PROFILE,
    )


async def test_the_save_needs_a_completed_embedding_stage(engine, stage_pool):
    for context_id, status in enumerate(["PENDING", "PROCESSING", "FAILED", "CANCELLED"], 1):
        await make_state(engine, context_id=context_id, embedding_status=status)
        assert await save_profile_vector(stage_pool, context_id) is False
        assert await vectors_by_profile(engine, context_id) == {}
    assert await save_profile_vector(stage_pool, 404) is False  # no state row


async def test_the_save_writes_only_its_own_profile_row(engine, stage_pool):
    await embedded_before_the_cutover(engine, 1, keyword_status="PROCESSING")
    before = await state_row(engine, 1)

    assert await save_profile_vector(stage_pool) is True

    vectors = await vectors_by_profile(engine, 1)
    np.testing.assert_allclose(vectors[PROFILE], vector("this profile"), atol=1e-7)
    assert_old_vector_kept(vectors)
    assert await state_row(engine, 1) == before


async def test_a_save_waiting_on_a_cancelling_transaction_stores_nothing(engine, stage_pool):
    await embedded_before_the_cutover(engine, 1, keyword_status="PENDING")

    async with engine.connect() as canceller:
        transaction = await canceller.begin()
        await canceller.execute(
            text(
                "UPDATE ai.context_ai_state SET embedding_status = 'CANCELLED', "
                "keyword_status = 'CANCELLED', updated_at = now() WHERE context_id = 1"
            )
        )
        saving = asyncio.create_task(save_profile_vector(stage_pool))
        await _until_lock_waiter(engine)
        assert not saving.done()
        await transaction.commit()
        saved = await saving

    assert saved is False
    assert set(await vectors_by_profile(engine, 1)) == {OTHER_PROFILE}


async def _until_lock_waiter(engine, limit_seconds: float = 10.0) -> None:
    async with asyncio.timeout(limit_seconds):
        while True:
            async with engine.connect() as conn:
                if (await conn.execute(LOCK_WAITERS)).scalar_one():
                    return
            await asyncio.sleep(0.01)
