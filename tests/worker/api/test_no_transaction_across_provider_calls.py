"""FC-03: no transaction or lock is held while a provider call is in flight (CONTRACT §3.2-§3.4).

FC-03 specifies provider delays of 8 s; this test uses 2 s per call so the suite stays fast.
2 s is ample: every check below runs only after all four calls of a stage have reached the fake
provider (``Scripted.entered``), and the checks take milliseconds.
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy import text

from tests.fake_openai import Scripted
from tests.worker.support import fetch_state, make_state, wait_for

PROVIDER_DELAY_SECONDS = 2.0
CONTEXT_IDS = (1, 2, 3, 4)
TEXT = "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음."

IDLE_IN_TRANSACTION = text(
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
    "AND state LIKE 'idle in transaction%'"
)
LOCK_STATE_NOWAIT = text(
    "SELECT embedding_status, keyword_status FROM ai.context_ai_state "
    "WHERE context_id = :id FOR UPDATE NOWAIT"
)


async def sessions_idle_in_transaction(engine) -> int:
    async with engine.connect() as conn:
        return (await conn.execute(IDLE_IN_TRANSACTION)).scalar_one()


async def lock_without_waiting(engine, context_id: int) -> tuple[str, str]:
    """Another session's ``FOR UPDATE NOWAIT``: raises at once if the worker holds the row."""
    async with engine.begin() as conn:
        row = (await conn.execute(LOCK_STATE_NOWAIT, {"id": context_id})).one()
        return row.embedding_status, row.keyword_status


async def test_fc03_rows_are_unlocked_and_no_session_idles_in_transaction_during_provider_calls(
    engine, make_worker, fake_openai, caplog
):
    for context_id in CONTEXT_IDS:
        await make_state(engine, context_id=context_id)
    embeddings = [Scripted(delay_seconds=PROVIDER_DELAY_SECONDS) for _ in CONTEXT_IDS]
    judgments = [Scripted(delay_seconds=PROVIDER_DELAY_SECONDS) for _ in CONTEXT_IDS]
    fake_openai.script_embeddings(*embeddings)
    fake_openai.script_judge(*judgments)

    # One provider call per stage (no micro-batching), so each call can be held and observed.
    async with make_worker(
        database_pool_size=2, worker_concurrency=4, embedding_batch_size=1
    ) as worker:
        responses = await asyncio.gather(
            *(
                worker.post({"contextId": i, "userId": 7, "recordId": 70, "text": TEXT})
                for i in CONTEXT_IDS
            )
        )
        assert [r.status_code for r in responses] == [202] * len(CONTEXT_IDS)

        for call in embeddings:
            await wait_for(call.entered)
        assert await sessions_idle_in_transaction(engine) == 0
        for context_id in CONTEXT_IDS:
            assert await lock_without_waiting(engine, context_id) == ("PROCESSING", "PENDING")

        for call in judgments:
            await wait_for(call.entered)
        assert await sessions_idle_in_transaction(engine) == 0
        for context_id in CONTEXT_IDS:
            assert await lock_without_waiting(engine, context_id) == ("COMPLETED", "PROCESSING")

        await worker.drain()

    for context_id in CONTEXT_IDS:
        assert await fetch_state(engine, context_id) == ("COMPLETED", "COMPLETED")
    assert fake_openai.embedding_calls == len(CONTEXT_IDS)
    assert fake_openai.judge_calls == len(CONTEXT_IDS)
    # No pool timeout or other transient failure along the way; only the startup warning
    # that the explicit pool (2) is below what 4 workers need.
    warnings = [
        r for r in caplog.records if r.name.startswith("app") and r.levelno >= logging.WARNING
    ]
    assert [r.name for r in warnings] == ["app.composition"]
    assert "PINLOG_DATABASE_POOL_SIZE=2 is below the 6 connections" in warnings[0].getMessage()
