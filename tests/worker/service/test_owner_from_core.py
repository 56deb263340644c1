"""The owner the core side wrote at create time is the truth (§7, §8).

A request naming another user or record is refused (WARNING without user text, counted in
``pinlog_contract_violations_total``, nothing stored, no provider call) and the correct one
still runs. A row without the owner columns keeps the first-request rule
(``test_owner_mismatch.py``).
"""

from __future__ import annotations

import logging

from sqlalchemy import text

from tests.worker.harness import RunningWorker
from tests.worker.support import count_rows, fetch_state, make_state

NOTE = "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음."


async def _violations(worker: RunningWorker, kind: str) -> float | None:
    return await worker.metric("pinlog_contract_violations_total", kind=kind)


async def test_wrong_first_dispatch_is_refused_and_the_correct_one_completes(
    engine, worker, fake_openai, caplog
):
    await make_state(engine, context_id=1, user_id=7, record_id=70)

    with caplog.at_level(logging.WARNING):
        await worker.process(1, NOTE, user_id=8, record_id=70)  # wrong user, first sight

    assert await _violations(worker, "owner_mismatch") == 1
    assert fake_openai.embedding_calls == 0
    assert await fetch_state(engine, 1) == ("PENDING", "PENDING")
    assert await count_rows(engine, "ai.context_text_fingerprint", 1) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("owner the core side recorded" in m and "context_id=1" in m for m in warnings)
    assert not any(NOTE in m for m in warnings)

    await worker.process(1, NOTE, user_id=7, record_id=70)

    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    async with engine.connect() as conn:
        owner = (
            await conn.execute(text("SELECT user_id, record_id FROM ai.context_embedding"))
        ).one()
    assert tuple(owner) == (7, 70)


async def test_mismatching_record_is_refused_even_after_the_context_completed(
    engine, worker, fake_openai
):
    await make_state(engine, context_id=1, user_id=7, record_id=70)
    await worker.process(1, NOTE, user_id=7, record_id=70)
    calls = fake_openai.embedding_calls

    await worker.process(1, NOTE, user_id=7, record_id=71)

    assert await _violations(worker, "owner_mismatch") == 1
    assert fake_openai.embedding_calls == calls
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")


async def test_row_without_owner_keeps_the_first_request_rule(engine, worker, fake_openai):
    await make_state(engine, context_id=1)  # the original contract: no owner columns
    await worker.process(1, NOTE, user_id=8, record_id=80)  # first request: its owner wins
    assert await _violations(worker, "owner_changed") == 0

    await worker.process(1, NOTE, user_id=7, record_id=70)

    assert await _violations(worker, "owner_changed") == 1
    async with engine.connect() as conn:
        owner = (
            await conn.execute(text("SELECT user_id, record_id FROM ai.context_embedding"))
        ).one()
    assert tuple(owner) == (8, 80)
