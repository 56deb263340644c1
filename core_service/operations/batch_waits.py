"""Sending the work a ``--via batch`` command marked, and waiting for its provider batches:
shared by ``reembed start --via batch`` and ``reprocess keywords --via batch``
(docs/operations.md "Backfill via the Batch API" and "Reprocess via the Batch API")."""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Awaitable, Callable

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from core_service.composition import Operations, build_backfill
from core_service.repository import provider_batches
from core_service.repository.db import autocommit
from core_service.service.pause import PauseSwitch
from core_service.service.reembed_backfill import ReembedBackfill


class Via(enum.StrEnum):
    """How ``reembed start`` and ``reprocess keywords`` send the work they start: at once
    (N a second), or by the provider's Batch API."""

    SYNC = "sync"
    BATCH = "batch"


# How long a command sends the marked work before it reports the first batch (seconds), how
# often it looks while waiting for the results (doubling from the first to the second), and
# how long it waits at most (the provider's 24-hour completion window and an hour more).
SUBMIT_WAIT_SECONDS = 120.0
FIRST_BATCH_POLL_SECONDS = 0.25
BATCH_POLL_SECONDS = 5.0
BATCH_WAIT_SECONDS = 25 * 3600.0


async def send_marked(
    operations: Operations,
    send: Callable[[ReembedBackfill], Awaitable[bool]],
    *,
    wait_seconds: float,
) -> PauseSwitch:
    """Call ``send`` (one request to the workers; whether there was anything to send) on a
    backfill loop of this process until it sends nothing or ``wait_seconds`` passed, waiting
    out the loop's backoff meanwhile. The pause switch it ran under."""
    await operations.refresh_routing()
    pause = PauseSwitch(operations.engine, operations.metrics)
    loop = build_backfill(
        operations.settings, operations.engine, operations.endpoints(), pause, operations.metrics
    )
    deadline = time.monotonic() + wait_seconds
    while time.monotonic() < deadline:
        wait = loop.backoff_seconds()
        if wait > 0:
            await asyncio.sleep(min(wait, max(deadline - time.monotonic(), 0.0)))
            continue
        if not await send(loop):
            break
    return pause


class BatchesStillOpen(Exception):
    """The wait for a ``--via batch`` command's results ended with work still open: the
    command did not get what ``--wait`` promised (exit 1)."""

    def __init__(self, open_work: int, open_batches: int, waited_seconds: float) -> None:
        super().__init__(
            f"{open_work} context(s) and {open_batches} batch(es) still open after "
            f"{waited_seconds:g} s; the workers keep polling them: follow with "
            "`pinlog-core status --json` (batches)"
        )


async def wait_until_settled(
    engine: AsyncEngine,
    *,
    profile: str,
    kind: str,
    open_work: Callable[[AsyncConnection], Awaitable[int]],
    on_progress: Callable[[int, int], None],
    wait_seconds: float = BATCH_WAIT_SECONDS,
) -> provider_batches.BatchCounts:
    """Wait until ``open_work`` (the marked work still open) is 0 and no batch of ``kind`` and
    ``profile`` is unsettled, at most ``wait_seconds``; ``on_progress(open work, open
    batches)`` after each look. The batches as they ended; ``BatchesStillOpen`` when the wait
    ran out first."""
    deadline = time.monotonic() + wait_seconds
    pause = FIRST_BATCH_POLL_SECONDS
    while True:
        async with autocommit(engine) as conn:
            work = await open_work(conn)
            now = await provider_batches.counts(conn, profile=profile, kind=kind)
        if work == 0 and now.in_progress == 0:
            return now
        if time.monotonic() >= deadline:
            raise BatchesStillOpen(work, now.in_progress, wait_seconds)
        on_progress(work, now.in_progress)
        await asyncio.sleep(pause)
        pause = min(pause * 2, BATCH_POLL_SECONDS)
