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

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import numpy as np
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from app.providers.hashing import hash_embed
from app.repository.db import register_vector_codec, to_array
from app.repository.profile_vectors import CLAIM_BACKFILL, SAVE_BACKFILL_VECTOR
from tests.worker.harness import PROCESS_PATH, PROFILE, SECRET, RunningWorker
from tests.worker.support import (
    count_rows,
    failure_reasons,
    fetch_state,
    make_embedding,
    make_state,
    vector,
)

# Another model's vectors, of another dimension (0060: the column declares none).
OTHER_PROFILE = "old-model-768-cosine-v1"
OTHER_DIMENSION = 768
DIMENSION = 1536
NOTE = "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음."
BACKFILL_PATH = "/internal/v1/backfill/embed"
LOCK_WAITERS = text(
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
)


@pytest.fixture
async def other_session(migrated_database: str) -> AsyncIterator[asyncpg.Connection]:
    """A separate asyncpg connection (with the vector codec): another worker's backfill save
    in a transaction of its own, held open as long as the test wants."""
    dsn = make_url(migrated_database).set(drivername="postgresql").render_as_string(False)
    conn = await asyncpg.connect(dsn)
    await register_vector_codec(conn)
    yield conn
    await conn.close()


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


async def propose(engine, context_id: int = 1, *, status: str = "PENDING") -> None:
    """The core's backfill row for the worker's profile."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO ai.context_embedding_backfill (embedding_profile, context_id, "
                "status) VALUES (:p, :id, :s)"
            ),
            {"p": PROFILE, "id": context_id, "s": status},
        )


async def state_row(engine, context_id: int = 1) -> dict[str, Any]:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text("SELECT * FROM ai.context_ai_state WHERE context_id = :id"),
                {"id": context_id},
            )
        ).one()
    return dict(row._mapping)


async def vectors_by_profile(engine, context_id: int = 1) -> dict[str, np.ndarray]:
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


async def post_process(worker: RunningWorker, context_id: int = 1) -> None:
    """The core's process request for the worker's profile; waits until it was handled."""
    response = await worker.client.post(
        PROCESS_PATH,
        json={
            "contextId": context_id,
            "userId": 7,
            "recordId": 70,
            "text": NOTE,
            "embeddingProfile": PROFILE,
        },
        headers={"X-Internal-Secret": SECRET},
    )
    assert response.status_code == 202, response.text
    await worker.drain()


async def backfill(worker: RunningWorker, context_id: int = 1) -> dict[str, int]:
    response = await worker.client.post(
        BACKFILL_PATH,
        json={
            "embeddingProfile": PROFILE,
            "contexts": [{"contextId": context_id, "userId": 7, "recordId": 70, "text": NOTE}],
        },
        headers={"X-Internal-Secret": SECRET},
    )
    assert response.status_code == 200, response.text
    return response.json()


def unchanged_stages(before: dict[str, Any], after: dict[str, Any]) -> bool:
    keys = ("embedding_status", "embedding_attempt", "keyword_status", "keyword_attempt")
    return all(before[k] == after[k] for k in keys)


async def wait_until_blocked_on_lock(engine, limit_seconds: float = 10.0) -> None:
    async with asyncio.timeout(limit_seconds):
        while True:
            async with engine.connect() as conn:
                if (await conn.execute(LOCK_WAITERS)).scalar_one():
                    return
            await asyncio.sleep(0.01)


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("backfill_status", ["PENDING", "PROCESSING"])
async def test_while_the_backfill_has_the_context_open_nothing_is_claimed(
    engine, worker, fake_openai, backfill_status
):
    await embedded_before_the_switch(engine)
    await propose(engine, status=backfill_status)
    before = await state_row(engine)

    await post_process(worker)

    assert unchanged_stages(before, await state_row(engine))
    assert await failure_reasons(engine, 1) == (None, None)
    assert set(await vectors_by_profile(engine)) == {OTHER_PROFILE}
    assert await count_rows(engine, "ai.context_keyword_analysis", 1) == 0
    assert (fake_openai.embedding_calls, fake_openai.judge_calls) == (0, 0)


async def test_after_the_backfill_the_keyword_stage_runs_on_the_vector_of_this_profile(
    engine, worker, fake_openai
):
    await embedded_before_the_switch(engine)
    await propose(engine)
    await post_process(worker)  # too early: nothing claimed
    assert await backfill(worker) == {
        "completed": 1,
        "cancelled": 0,
        "failed": 0,
        "notClaimed": 0,
        "lost": 0,
    }
    before = await state_row(engine)
    embedding_calls = fake_openai.embedding_calls

    await post_process(worker)  # the rescan asks again

    after = await state_row(engine)
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
    vectors = await vectors_by_profile(engine)
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
        await propose(engine, status=backfill_status)

    await post_process(worker)

    assert await fetch_state(engine, 1) == ("COMPLETED", "FAILED")
    assert await failure_reasons(engine, 1) == (None, "profile_mismatch")
    assert set(await vectors_by_profile(engine)) == {OTHER_PROFILE}
    assert (fake_openai.embedding_calls, fake_openai.judge_calls) == (0, 0)


async def test_a_start_waiting_on_the_backfill_save_claims_nothing_then_completes(
    engine, worker, fake_openai, other_session
):
    # The backfill's save locks the state row first (docs/lock-order.md). A process request
    # whose start waits on that lock reads the other tables as they were when it began: the
    # backfill still open, no vector of this profile. It must claim nothing rather than fail
    # the judgment; the next request finds the vector.
    await embedded_before_the_switch(engine)
    await propose(engine)
    transaction = other_session.transaction()
    await transaction.start()
    try:
        claimed = await other_session.fetchrow(
            CLAIM_BACKFILL.sql,
            *CLAIM_BACKFILL.bind(
                {"embedding_profile": PROFILE, "context_ids": [1], "expiry_seconds": 600.0}
            ),
        )
        assert list(claimed["attempts"]) == [1]
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
        processing = asyncio.create_task(worker.process(1, NOTE, user_id=7, record_id=70))
        await wait_until_blocked_on_lock(engine)
        assert not processing.done()
        await transaction.commit()
        await processing
    finally:
        if other_session.is_in_transaction():
            await transaction.rollback()

    assert await fetch_state(engine, 1) == ("COMPLETED", "PENDING")
    assert await failure_reasons(engine, 1) == (None, None)

    await worker.process(1, NOTE, user_id=7, record_id=70)

    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert await analysis_profile(engine) == PROFILE
    assert fake_openai.embedding_calls == 0
