"""Raw HTTP bodies and fake-provider events for API tests."""

from __future__ import annotations

import asyncio
import threading

import httpx

from tests.harness import PROCESS_PATH, SECRET, RunningWorker

EVENT_TIMEOUT_SECONDS = 10.0


async def post_raw(worker: RunningWorker, raw: str) -> httpx.Response:
    """POST ``raw`` verbatim as the JSON body, so float literals and escapes arrive as written."""
    return await worker.client.post(
        PROCESS_PATH,
        content=raw.encode(),
        headers={"X-Internal-Secret": SECRET, "Content-Type": "application/json"},
    )


async def wait_for(event: threading.Event) -> None:
    """Wait for a fake-provider event without blocking the event loop the worker runs on."""
    if not await asyncio.to_thread(event.wait, EVENT_TIMEOUT_SECONDS):
        raise AssertionError(f"event not set within {EVENT_TIMEOUT_SECONDS} s")
