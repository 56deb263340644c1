"""One contextId always belongs to one user and record (§0 principle 1, §7 user filter)."""

from __future__ import annotations

import logging

from sqlalchemy import text

from tests.fake_openai import Scripted
from tests.worker.support import backdate, fetch_state, make_state

NOTE = "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음."


async def test_request_naming_another_owner_is_ignored_and_never_stores_under_that_user(
    engine, worker, fake_openai, caplog
):
    await make_state(engine, context_id=1)
    fake_openai.script_embeddings(Scripted(status=503))
    await worker.process(1, NOTE, user_id=7, record_id=70)  # first sight: user 7, transient
    await backdate(engine, 1, seconds=3600)  # reclaimable by the next request

    with caplog.at_level(logging.WARNING):
        await worker.process(1, NOTE, user_id=8, record_id=80)

    assert fake_openai.embedding_calls == 1
    assert await fetch_state(engine, 1) == ("PROCESSING", "PENDING")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("different userId or recordId" in m and "context_id=1" in m for m in warnings)

    await worker.process(1, NOTE, user_id=7, record_id=70)

    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    async with engine.connect() as conn:
        owner = (
            await conn.execute(text("SELECT user_id, record_id FROM ai.context_embedding"))
        ).one()
    assert tuple(owner) == (7, 70)
