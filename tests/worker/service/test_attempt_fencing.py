"""Fencing a superseded attempt (§2, docs/state-machine.md "Attempts").

Attempt A stalls in its provider call past the expiry (``updated_at`` backdated), attempt B
reclaims the stage and finishes; A's late save must change nothing, so exactly B's result
remains. The core side's rescan claim (``retry_count``, ``rescanned_at``) never invalidates a
live attempt. Real worker, real fake provider, real concurrent transactions; held calls, no
sleeps.
"""

from __future__ import annotations

import numpy as np
from sqlalchemy import text

from core_service.repository import context_ai_state as core_state
from tests.fake_openai import Scripted, embedding_body, judge_body
from tests.worker.support import (
    backdate,
    fetch_state,
    keyword_rows,
    make_state,
    release,
    start_held,
    stored_analysis,
    stored_embedding,
    vector,
)

NOTE = "비 오는 날 창가 자리에서 책 읽기 좋은 조용한 카페."
STALE = 3600  # seconds: older than the 600 s expiry


async def _attempts(engine, context_id: int) -> tuple[int, int]:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT embedding_attempt, keyword_attempt FROM ai.context_ai_state "
                    "WHERE context_id = :id"
                ),
                {"id": context_id},
            )
        ).one()
    return row.embedding_attempt, row.keyword_attempt


async def test_superseded_embedding_attempt_stores_nothing_and_b_result_remains(
    engine, worker, fake_openai, hold
):
    await make_state(engine, context_id=1)
    held = hold()
    attempt_a = await start_held(worker, fake_openai.script_embeddings, held, 1, NOTE)
    await backdate(engine, 1, seconds=STALE)  # A looks dead: B may reclaim (§2)
    b_vector = vector("attempt B")
    fake_openai.script_embeddings(Scripted(json=embedding_body([b_vector])))

    await worker.process(1, NOTE)  # B: reclaim, store, judge

    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    release(held)  # A's answer (another vector) arrives late
    await attempt_a

    assert fake_openai.embedding_calls == 2
    stored = await stored_embedding(engine, 1)
    assert stored is not None
    np.testing.assert_allclose(stored.embedding, b_vector, atol=1e-6)
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert await _attempts(engine, 1) == (2, 1)


async def test_superseded_keyword_attempt_stores_nothing_and_b_result_remains(
    engine, worker, fake_openai, hold, usable_preset_ids
):
    await make_state(engine, context_id=1)
    held = hold()
    attempt_a = await start_held(worker, fake_openai.script_judge, held, 1, NOTE)
    await backdate(engine, 1, seconds=STALE)

    # B reclaims the keyword stage (embedding reused) and selects nothing at all.
    fake_openai.script_judge(Scripted(json=judge_body([], unmatched=["B"])))
    await worker.process(1, NOTE)
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")

    release(held)  # A's default answer selects a keyword
    await attempt_a

    assert fake_openai.embedding_calls == 1
    assert fake_openai.judge_calls == 2
    assert await keyword_rows(engine, 1) == {}
    analysis = await stored_analysis(engine, 1)
    assert analysis is not None and analysis.unmatched_concepts == ["B"]
    assert await _attempts(engine, 1) == (1, 2)


async def test_superseded_attempt_cannot_fail_the_stage_its_successor_holds(
    engine, worker, fake_openai, hold
):
    await make_state(engine, context_id=1)
    held = Scripted(status=400, block=hold().block)  # A ends in a permanent error, late
    attempt_a = await start_held(worker, fake_openai.script_embeddings, held, 1, NOTE)
    await backdate(engine, 1, seconds=STALE)
    held_b = hold()
    attempt_b = await start_held(worker, fake_openai.script_embeddings, held_b, 1, NOTE)

    release(held)
    await attempt_a  # A's 400 would mark FAILED; B's claim fences it off
    assert await fetch_state(engine, 1) == ("PROCESSING", "PENDING")

    release(held_b)
    await attempt_b
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")


async def test_rescan_claim_during_a_live_attempt_never_invalidates_it(
    engine, worker, fake_openai, hold
):
    """The rescan's claim writes rescanned_at only (a retry is spent after an accepted
    dispatch, docs/rescan.md "Budget"), never updated_at or an attempt, so the attempt it
    re-requests for is still the live one."""
    await make_state(engine, context_id=1)
    held = hold()
    attempt_a = await start_held(worker, fake_openai.script_embeddings, held, 1, NOTE)
    await backdate(engine, 1, seconds=STALE)  # stale for the rescan too

    async with engine.begin() as conn:
        claimed = await core_state.claim_stale(
            conn,
            expiries=core_state.Expiries(pending_seconds=300, processing_seconds=600),
            max_retry=3,
            batch_size=10,
        )
    assert claimed == [(1, 0)]  # nothing spent by the claim itself

    release(held)
    await attempt_a

    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert await stored_embedding(engine, 1) is not None
    assert await _attempts(engine, 1) == (1, 1)
