"""Shutdown with work in flight (CONTRACT §6, FC-02, docs/operations.md "Shutdown").

The old process must exit within the grace period, list the abandoned ids once, leave no
half-applied save, and leave every interrupted stage to the rescan.
"""

from __future__ import annotations

import asyncio
import logging
import time

from tests.worker.harness import running_worker, worker_settings
from tests.worker.support import (
    app_records,
    arrived,
    backdate,
    count_rows,
    fetch_state,
    make_state,
    release,
)

NOTES = {
    1: "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음.",
    2: "친구들이랑 수다 떨기 좋은 넓은 술집. 단체석 있음.",
    3: "아이와 함께 가기 좋은 넓은 공원. 놀이터 있음.",
}
GRACE = 0.5
EXPIRY_PLUS = 700


def _body(context_id: int) -> dict:
    return {"contextId": context_id, "userId": 1, "recordId": 1, "text": NOTES[context_id]}


async def test_fc02_shutdown_with_judgments_in_flight_abandons_cleanly_and_recovers(
    engine, migrated_database, fake_openai, presets, hold, caplog
):
    """FC-02 (3 contexts, 0.5 s grace): exit within the grace, one WARNING naming every
    abandoned id, no half-applied save, keyword left ``PROCESSING``; after the expiry a fresh
    worker completes each with exactly one result set."""
    held = [hold() for _ in NOTES]
    fake_openai.script_judge(*held)
    for context_id in NOTES:
        await make_state(engine, context_id=context_id)
    settings = worker_settings(migrated_database, fake_openai, shutdown_grace_seconds=GRACE)

    async with running_worker(settings) as worker:
        for context_id in NOTES:
            assert (await worker.post(_body(context_id))).status_code == 202
        for scripted in held:
            await arrived(scripted)
        stopping = time.monotonic()
    elapsed = time.monotonic() - stopping

    assert elapsed < GRACE + 2.0
    abandoned = [
        r.getMessage()
        for r in app_records(caplog, logging.WARNING)
        if "abandoned" in r.getMessage()
    ]
    assert abandoned == ["shutdown abandoned 3 contexts to the rescan: context_ids=[1, 2, 3]"]
    for context_id in NOTES:
        assert await fetch_state(engine, context_id) == ("COMPLETED", "PROCESSING")
        assert await count_rows(engine, "ai.context_keyword", context_id) == 0
        assert await count_rows(engine, "ai.context_keyword_analysis", context_id) == 0

    for scripted in held:
        release(scripted)
    async with running_worker(worker_settings(migrated_database, fake_openai)) as fresh:
        for context_id in NOTES:
            await backdate(engine, context_id, seconds=EXPIRY_PLUS)
            await fresh.process(context_id, NOTES[context_id])
    for context_id in NOTES:
        assert await fetch_state(engine, context_id) == ("COMPLETED", "COMPLETED")
        assert await count_rows(engine, "ai.context_keyword", context_id) == 1
        assert await count_rows(engine, "ai.context_keyword_analysis", context_id) == 1


async def test_queued_context_is_not_started_once_shutdown_has_begun(
    engine, migrated_database, fake_openai, presets, hold
):
    """docs/operations.md "Shutdown", §9: once ``pool.stop`` has begun, a queued context is not
    claimed: it stays ``PENDING`` for the rescan, is reported abandoned, and costs no call."""
    first, second = hold(), hold()
    fake_openai.script_embeddings(first, second)
    for context_id in (1, 2):
        await make_state(engine, context_id=context_id)
    settings = worker_settings(
        migrated_database, fake_openai, worker_concurrency=1, shutdown_grace_seconds=GRACE
    )
    async with running_worker(settings) as worker:
        for context_id in (1, 2):
            assert (await worker.post(_body(context_id))).status_code == 202
        await arrived(first)
        stopping = asyncio.create_task(worker.app.state.pool.stop(1.0))
        await asyncio.sleep(0)  # stop() has started: no longer accepting
        release(first)
        abandoned = await stopping

    assert abandoned == [2]
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert await fetch_state(engine, 2) == ("PENDING", "PENDING")
    assert fake_openai.embedding_calls == 1
