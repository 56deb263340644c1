"""The keyword stage of a context embedded under another profile, around a profile switch
(docs/contract.md §1 Deviation "context vectors per profile", §5, §10 #13; docs/operations.md
"Switching the embedding profile").

The start reads the vector of the worker's profile when the context has one, else another
profile's. While a backfill of the worker's profile still has the context open, such a
mismatch claims nothing (the vector is on its way; the rescan asks again); once the backfill
stored the vector, the keyword stage runs on it without a provider call and without touching
the live embedding stage, and the analysis names the worker's profile. With no backfill open
the mismatch stays what §5 says: the keyword stage ends ``FAILED`` with ``profile_mismatch``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from app.providers.hashing import hash_embed
from app.repository.profile_vectors import SAVE_BACKFILL_VECTOR
from tests.worker.backfill_support import (
    backfill_counts,
    claimed,
    claimed_in_open_transaction,
    make_backfill,
    post_backfill,
    vectors_by_profile,
)
from tests.worker.harness import PROFILE, RunningWorker
from tests.worker.open_transactions import finished_behind_lock
from tests.worker.support import (
    count_rows,
    failure_reasons,
    fetch_state,
    make_embedding,
    make_state,
    process_request,
    state_row,
    vector,
)

# Another model's vectors, of another dimension (0060: the column declares none).
OTHER_PROFILE = "old-model-768-cosine-v1"
OTHER_DIMENSION = 768
DIMENSION = 1536
NOTE = "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음."


# --------------------------------------------------------------------------- builders and reads


async def embedded_before_the_switch(engine, context_id: int = 1) -> None:
    """Embedding COMPLETED under the old profile only; the keyword stage still to run (a
    re-judgment after the cutover, or one that never ran)."""
    await make_state(
        engine,
        context_id=context_id,
        embedding_status="COMPLETED",
        keyword_status="PENDING",
        user_id=7,
        record_id=70,
    )
    await make_embedding(
        engine,
        context_id=context_id,
        user_id=7,
        record_id=70,
        profile=OTHER_PROFILE,
        embedding=vector("old", dimension=OTHER_DIMENSION),
    )


async def analysis_profile(engine, context_id: int = 1) -> str | None:
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


async def post_process(worker: RunningWorker) -> None:
    """The core's process request for the worker's profile; waits until it was handled."""
    response = await process_request(worker, context_id=1, text=NOTE)
    assert response.status_code == 202, response.text


async def backfill(worker: RunningWorker) -> dict[str, int]:
    contexts = [{"contextId": 1, "userId": 7, "recordId": 70, "text": NOTE}]
    response = await post_backfill(worker, contexts)
    assert response.status_code == 200, response.text
    return response.json()


def unchanged_stages(before: dict[str, Any], after: dict[str, Any]) -> bool:
    keys = ("embedding_status", "embedding_attempt", "keyword_status", "keyword_attempt")
    return all(before[k] == after[k] for k in keys)


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("backfill_status", ["PENDING", "PROCESSING"])
async def test_while_the_backfill_has_the_context_open_nothing_is_claimed(
    engine, worker, fake_openai, backfill_status
):
    await embedded_before_the_switch(engine)
    await make_backfill(engine, context_id=1, profile=PROFILE, status=backfill_status, text=NOTE)
    before = await state_row(engine, 1)

    await post_process(worker)

    assert unchanged_stages(before, await state_row(engine, 1))
    assert await failure_reasons(engine, 1) == (None, None)
    assert set(await vectors_by_profile(engine, 1)) == {OTHER_PROFILE}
    assert await count_rows(engine, "ai.context_keyword_analysis", 1) == 0
    assert (fake_openai.embedding_calls, fake_openai.judge_calls) == (0, 0)


async def test_after_the_backfill_the_keyword_stage_runs_on_the_vector_of_this_profile(
    engine, worker, fake_openai
):
    await embedded_before_the_switch(engine)
    await make_backfill(engine, context_id=1, profile=PROFILE, text=NOTE)
    await post_process(worker)  # too early: nothing claimed
    assert await backfill(worker) == backfill_counts(completed=1)
    before = await state_row(engine, 1)
    embedding_calls = fake_openai.embedding_calls

    await post_process(worker)  # the rescan asks again

    after = await state_row(engine, 1)
    # The live embedding stage is untouched; the keyword stage ran once and completed.
    assert (after["embedding_status"], after["embedding_attempt"]) == (
        before["embedding_status"],
        before["embedding_attempt"],
    )
    assert (after["keyword_status"], after["keyword_attempt"]) == ("COMPLETED", 1)
    assert await analysis_profile(engine) == PROFILE
    # The backfilled vector was reused: no embedding call, one judgment.
    assert fake_openai.embedding_calls == embedding_calls
    assert fake_openai.judge_calls == 1
    vectors = await vectors_by_profile(engine, 1)
    assert vectors[PROFILE].shape == (DIMENSION,)
    np.testing.assert_allclose(vectors[PROFILE], hash_embed(NOTE, DIMENSION), atol=1e-6)
    np.testing.assert_array_equal(vectors[OTHER_PROFILE], vector("old", dimension=OTHER_DIMENSION))


@pytest.mark.parametrize("backfill_status", [None, "FAILED", "CANCELLED"])
async def test_without_an_open_backfill_the_mismatch_fails_the_keyword_stage(
    engine, worker, fake_openai, backfill_status
):
    # §5 and §10 #13: a COMPLETED vector of another profile is never regenerated by the live
    # stages; nothing will bring this profile's one, so the judgment is a mismatch.
    await embedded_before_the_switch(engine)
    if backfill_status is not None:
        await make_backfill(
            engine, context_id=1, profile=PROFILE, status=backfill_status, text=NOTE
        )

    await post_process(worker)

    assert await fetch_state(engine, 1) == ("COMPLETED", "FAILED")
    assert await failure_reasons(engine, 1) == (None, "profile_mismatch")
    assert set(await vectors_by_profile(engine, 1)) == {OTHER_PROFILE}
    assert (fake_openai.embedding_calls, fake_openai.judge_calls) == (0, 0)


async def test_a_start_waiting_on_the_backfill_save_claims_nothing_then_completes(
    engine, worker, fake_openai, other_session
):
    # The backfill's save locks the state row first (docs/lock-order.md). A process request
    # whose start waits on that lock reads the other tables as they were when it began: the
    # backfill still open, no vector of this profile. It must claim nothing rather than fail
    # the judgment; the next request finds the vector.
    await embedded_before_the_switch(engine)
    await make_backfill(engine, context_id=1, profile=PROFILE, text=NOTE)
    async with claimed_in_open_transaction(
        other_session, [1], profile=PROFILE, text=NOTE
    ) as theirs:
        assert theirs.claims == [claimed(1, 1)]
        saved = await other_session.fetchrow(
            SAVE_BACKFILL_VECTOR.sql,
            *SAVE_BACKFILL_VECTOR.bind(
                {
                    "context_id": 1,
                    "attempt": 1,
                    "embedding_profile": PROFILE,
                    "user_id": 7,
                    "record_id": 70,
                    "embedding": hash_embed(NOTE, DIMENSION),
                }
            ),
        )
        assert saved["status"] == "COMPLETED"
        await finished_behind_lock(
            engine,
            worker.process(1, NOTE, user_id=7, record_id=70),
            theirs.transaction.commit,
        )

    assert await fetch_state(engine, 1) == ("COMPLETED", "PENDING")
    assert await failure_reasons(engine, 1) == (None, None)

    await worker.process(1, NOTE, user_id=7, record_id=70)

    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert await analysis_profile(engine) == PROFILE
    assert fake_openai.embedding_calls == 0
