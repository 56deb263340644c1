"""The ``Retry-After`` of a full queue comes from the measured drain rate.

A fixed 5 s made every refused caller of a burst wait while the queue emptied; the estimate
asks callers back when the queue is about half drained, is not fooled by an idle spell, and
asks for longer waits from a pool whose work hangs. Real asyncio queue and tasks; the handler
is gated by events.
"""

from __future__ import annotations

import asyncio
import math

from app.metrics import WorkerMetrics
from app.service.requests import ProcessRequest
from app.service.worker_pool import (
    ASSUMED_REQUEST_SECONDS,
    DEFAULT_RETRY_AFTER_SECONDS,
    MAX_RETRY_AFTER_SECONDS,
    MIN_RETRY_AFTER_SECONDS,
    WorkerPool,
)

CAPACITY = 10


def _request(context_id: int) -> ProcessRequest:
    return ProcessRequest(context_id=context_id, user_id=1, record_id=1, text="note")


class GatedHandler:
    """Finishes the first ``free`` requests at once, then holds every later one."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.finished = 0
        self.gate = asyncio.Event()
        self.holding = asyncio.Event()

    async def __call__(self, _request: ProcessRequest) -> None:
        if self.finished >= self.free:
            self.holding.set()
            await self.gate.wait()
        self.finished += 1


async def _full_pool(handler: GatedHandler) -> WorkerPool:
    pool = WorkerPool(handler, concurrency=1, capacity=CAPACITY, metrics=WorkerMetrics())
    pool.start()
    for context_id in range(1, handler.free + 1):
        assert pool.submit(_request(context_id))
        await pool.join()
    # One request held by the only task, then a full queue behind it.
    assert pool.submit(_request(1000))
    await handler.holding.wait()
    for context_id in range(1001, 1001 + CAPACITY):
        assert pool.submit(_request(context_id))
    assert not pool.submit(_request(9999))
    return pool


async def test_a_cold_pool_assumes_a_typical_request_and_still_sees_a_hang():
    """Nothing finished yet (a burst meets a fresh worker): a fixed 5 s left the worker idle
    for 4 s of a 1 s drain; each request is assumed to take ASSUMED_REQUEST_SECONDS instead,
    and a first request that hangs still raises the answer."""
    handler = GatedHandler(free=0)
    pool = await _full_pool(handler)
    try:
        # One task, half a queue of 10 at 0.25 s each: 1.25 s, about a second.
        expected = math.floor(CAPACITY / 2 * ASSUMED_REQUEST_SECONDS + 0.5)
        assert pool.retry_after_seconds() == expected < DEFAULT_RETRY_AFTER_SECONDS
        await asyncio.sleep(1.2)
        assert pool.retry_after_seconds() > expected
    finally:
        handler.gate.set()
        await pool.stop(grace_seconds=1)


async def test_a_fast_pool_asks_for_the_minimum():
    handler = GatedHandler(free=40)  # forty finished within milliseconds
    pool = await _full_pool(handler)
    try:
        assert pool.retry_after_seconds() == MIN_RETRY_AFTER_SECONDS
    finally:
        handler.gate.set()
        await pool.stop(grace_seconds=1)


async def test_an_idle_spell_before_a_burst_does_not_count_as_slowness():
    handler = GatedHandler(free=4)
    pool = WorkerPool(handler, concurrency=1, capacity=CAPACITY, metrics=WorkerMetrics())
    pool.start()
    try:
        for context_id in range(1, 5):
            assert pool.submit(_request(context_id))
            await pool.join()
        await asyncio.sleep(1.5)  # nothing to do for a while, then a burst fills the queue
        handler.free = 10**6
        handler.gate.set()
        for context_id in range(100, 100 + CAPACITY):
            pool.submit(_request(context_id))
        assert pool.retry_after_seconds() == MIN_RETRY_AFTER_SECONDS
    finally:
        await pool.stop(grace_seconds=1)


async def test_a_pool_whose_work_hangs_asks_for_longer_and_longer_waits():
    handler = GatedHandler(free=2)  # two finished at once, then the third hangs
    pool = await _full_pool(handler)
    try:
        await asyncio.sleep(1.0)
        after_one_second = pool.retry_after_seconds()
        # One task, its request running for at least 1 s, half the queue to drain: >= 5 s.
        assert after_one_second >= math.ceil(CAPACITY / 2 * 1.0)
        await asyncio.sleep(1.0)
        after_two_seconds = pool.retry_after_seconds()
        assert after_one_second < after_two_seconds <= MAX_RETRY_AFTER_SECONDS
    finally:
        handler.gate.set()
        await pool.stop(grace_seconds=1)


async def test_a_stopping_pool_asks_for_the_default():
    handler = GatedHandler(free=40)
    pool = await _full_pool(handler)
    handler.gate.set()
    await pool.stop(grace_seconds=1)
    assert not pool.submit(_request(1))
    assert pool.retry_after_seconds() == DEFAULT_RETRY_AFTER_SECONDS


async def test_one_slow_request_does_not_count_as_every_task_being_slow():
    """Four tasks: three finish at once, one request hangs. The three keep draining, so a
    queue filled behind them is asked back after the minimum, not after the hung one's age
    times half the queue over four tasks."""
    hung = asyncio.Event()
    gate = asyncio.Event()

    async def handler(request: ProcessRequest) -> None:
        if request.context_id == 1000:
            hung.set()
            await gate.wait()

    pool = WorkerPool(handler, concurrency=4, capacity=CAPACITY, metrics=WorkerMetrics())
    pool.start()
    try:
        for context_id in range(1, 41):
            assert pool.submit(_request(context_id))
            await pool.join()
        assert pool.submit(_request(1000))
        await hung.wait()
        await asyncio.sleep(2.0)
        # Filled without yielding to the event loop: three tasks idle, one 2 s into its work.
        for context_id in range(2000, 2000 + CAPACITY):
            assert pool.submit(_request(context_id))
        assert pool.retry_after_seconds() == MIN_RETRY_AFTER_SECONDS
    finally:
        gate.set()
        await pool.stop(grace_seconds=1)


async def test_the_start_of_a_burst_does_not_count_as_slowness():
    """Every task starts at once when a burst arrives: their common age (under a second) says
    nothing about a hang. Counting it asked callers to wait 2 s where the queue drained in 1."""
    handler = GatedHandler(free=8)
    pool = WorkerPool(handler, concurrency=4, capacity=CAPACITY, metrics=WorkerMetrics())
    pool.start()
    try:
        for context_id in range(1, 9):  # a quick mean duration
            assert pool.submit(_request(context_id))
            await pool.join()
        for context_id in range(100, 104):  # four running...
            assert pool.submit(_request(context_id))
        await asyncio.sleep(0.05)  # ...once the tasks took them
        for context_id in range(200, 200 + CAPACITY):  # and a full queue behind them
            assert pool.submit(_request(context_id))
        await asyncio.sleep(0.85)
        # Four tasks each 0.9 s into their request: a half-queue drain of 5 / (4 / 0.9 s) =
        # 1.1 s if their age counted; about a second, and at the mean far less.
        assert pool.retry_after_seconds() == MIN_RETRY_AFTER_SECONDS
    finally:
        handler.gate.set()
        await pool.stop(grace_seconds=1)
