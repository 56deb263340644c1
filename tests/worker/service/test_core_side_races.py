"""Interleavings with the core side's transitions (CONTRACT §2, §3, §4, §9).

Ordered with held provider calls (``Scripted.block``) and events, never with sleeps.
"""

from __future__ import annotations

import asyncio

from sqlalchemy import text

from tests.worker.support import (
    fetch_state,
    keyword_rows,
    make_state,
    release,
    start_held,
    stored_analysis,
    stored_embedding,
)

NOTE = "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음."

LOCK_WAITERS = text(
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
)


async def _until_lock_waiters(engine, *, at_least: int) -> None:
    for _ in range(500):
        async with engine.connect() as conn:
            if (await conn.execute(LOCK_WAITERS)).scalar_one() >= at_least:
                return
        await asyncio.sleep(0.01)
    raise AssertionError("claims never queued behind the row lock")


async def test_preset_reload_during_a_judgment_does_not_mix_preset_versions(
    engine, worker, fake_openai, hold
):
    """§4: one preset snapshot from candidate search to save. A reload to version 7 during the
    judge call leaves the stored ``preset_version`` (rows and analysis) at the snapshot's 1;
    the next context uses 7."""
    await make_state(engine, context_id=1)
    await make_state(engine, context_id=2)
    held = hold()
    task = await start_held(worker, fake_openai.script_judge, held, 1, NOTE)

    async with engine.begin() as conn:  # as a load of version 7 leaves them
        await conn.execute(text("UPDATE ai.keyword_preset SET version = 7"))
        await conn.execute(text("UPDATE ai.keyword_preset_embedding SET preset_version = 7"))
    await worker.app.state.presets.reload()
    release(held)
    await task
    await worker.process(2, NOTE)

    first = await keyword_rows(engine, 1)
    second = await keyword_rows(engine, 2)
    analysis_first, analysis_second = (
        await stored_analysis(engine, 1),
        await stored_analysis(engine, 2),
    )
    assert first and {v for _, v in first.values()} == {1}
    assert analysis_first is not None and analysis_first.preset_version == 1
    assert second and {v for _, v in second.values()} == {7}
    assert analysis_second is not None and analysis_second.preset_version == 7


async def test_cancel_racing_the_claim_statement_never_ends_processing(engine, worker):
    """§2, §9: the core side's ``CANCELLED`` is final: twenty claims released together with the
    cancel never move it, whatever the order, and nothing is stored."""
    await make_state(engine, context_id=1)
    async with engine.connect() as blocker:
        transaction = await blocker.begin()
        await blocker.execute(
            text("SELECT 1 FROM ai.context_ai_state WHERE context_id = 1 FOR UPDATE")
        )
        claims = [asyncio.create_task(worker.process(1, NOTE)) for _ in range(20)]
        await _until_lock_waiters(engine, at_least=5)  # claims queued behind the lock
        await blocker.execute(
            text(
                "UPDATE ai.context_ai_state SET embedding_status = 'CANCELLED', "
                "keyword_status = 'CANCELLED', updated_at = now() WHERE context_id = 1"
            )
        )
        await transaction.commit()
    await asyncio.gather(*claims)

    assert await fetch_state(engine, 1) == ("CANCELLED", "CANCELLED")
    assert await stored_embedding(engine, 1) is None
