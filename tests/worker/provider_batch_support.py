"""Worker-side test helpers for work sent through the provider's Batch API (the embedding
backfill's and the keyword reprocess's batches): a batch request posted as the core sends it,
a batch's ``ai.provider_batch`` row, a batch held in progress, waits until the fake provider
polled it or a worker settled it, and the core's cancel request."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable

from sqlalchemy import text

from tests.worker.harness import SECRET, RunningWorker

# Longest wait for a batch to reach a state (seconds); the waits poll the observed state.
WAIT_SECONDS = 20.0


async def post_batch(worker: RunningWorker, path: str, body: dict) -> dict:
    """The 200 answer of a batch request ``body`` posted to ``path`` as the core sends it."""
    response = await worker.client.post(path, json=body, headers={"X-Internal-Secret": SECRET})
    assert response.status_code == 200, response.text
    return response.json()


async def batch_record(engine, batch_id: str) -> dict:
    """The batch's ``ai.provider_batch`` row."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text("SELECT * FROM ai.provider_batch WHERE batch_id = :id"), {"id": batch_id}
            )
        ).one()
    return dict(row._mapping)


async def settled(engine, batch_id: str) -> dict:
    """The batch's row once a worker settled it (fails after ``WAIT_SECONDS``)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        record = await batch_record(engine, batch_id)
        if record["settled"]:
            return record
        assert time.monotonic() < deadline, f"batch not settled: {record['status']}"
        await asyncio.sleep(0.02)


async def polled_as(fake_openai, batch_id: str, status: str) -> None:
    """Once the fake provider reports the batch ``status`` (fails after ``WAIT_SECONDS``)."""
    deadline = time.monotonic() + WAIT_SECONDS
    while fake_openai.batches.batch(batch_id)["status"] != status:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)


async def in_progress(fake_openai, submitting: Awaitable[dict]) -> str:
    """The id of the batch ``submitting`` (a batch request not yet sent) creates, the fake
    provider holding it ``in_progress`` and a worker having polled it so."""
    fake_openai.batches.hold_batches(True)
    batch_id = (await submitting)["batchId"]
    await polled_as(fake_openai, batch_id, "in_progress")
    return batch_id


async def ask_cancelled(engine, batch_id: str) -> None:
    """The core asks the batch cancelled (a rollback or finish, a run abandoned)."""
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE ai.provider_batch SET cancel_requested = true WHERE batch_id = :b"),
            {"b": batch_id},
        )
