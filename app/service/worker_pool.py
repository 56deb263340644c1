"""A bounded in-process queue drained by ``concurrency`` asyncio workers (§3).

``submit`` never blocks: a full queue is refused at once so the API can answer 503. The
persisted state row is the real queue; dropping queued items on shutdown loses no work, the
core side's rescan re-requests them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable

from app.errors import TransientError
from app.metrics import WorkerMetrics
from app.service.requests import ProcessRequest
from pinlog_platform import tracing
from pinlog_platform.logging import log_context

logger = logging.getLogger(__name__)

# Retry-After of a refusal while the pool is stopping (whole seconds, RFC 9110): another
# replica may take the request.
DEFAULT_RETRY_AFTER_SECONDS = 5
# The time one request is assumed to take before any has finished (seconds): two provider
# calls of about 100 ms. A cold worker meeting a burst then asks for about a second, not 5.
ASSUMED_REQUEST_SECONDS = 0.25
# Bounds of the estimated Retry-After (seconds): a stuck pool asks for at most a minute.
MIN_RETRY_AFTER_SECONDS = 1
MAX_RETRY_AFTER_SECONDS = 60
# A running request older than this (and than the mean) slows the estimated drain rate
# (seconds).
SLOW_REQUEST_SECONDS = 1.0
# Durations of the latest handled requests remembered for the drain rate.
DRAIN_RATE_WINDOW = 64


class WorkerPool:
    """``concurrency`` tasks running ``handler`` on requests from a queue of ``capacity``.

    ``metrics``: refusals are counted in ``pinlog_process_requests_rejected_total`` and the
    queue length is read into ``pinlog_queue_depth`` when scraped (no cost per request).
    """

    def __init__(
        self,
        handler: Callable[[ProcessRequest], Awaitable[None]],
        *,
        concurrency: int,
        capacity: int,
        metrics: WorkerMetrics,
    ) -> None:
        self._handler = handler
        self._concurrency = concurrency
        self._queue: asyncio.Queue[ProcessRequest] = asyncio.Queue(maxsize=capacity)
        self._rejected_full = metrics.rejected["queue_full"]
        self._rejected_stopping = metrics.rejected["shutting_down"]
        metrics.queue_depth.set_function(self._queue.qsize)
        self._workers: list[asyncio.Task[None]] = []
        # The running request of each busy task: its context id and start (monotonic seconds).
        self._in_flight: dict[asyncio.Task[None], tuple[int, float]] = {}
        self._accepting = False
        # Seconds the latest requests took: the drain rate.
        self._durations: deque[float] = deque(maxlen=DRAIN_RATE_WINDOW)

    def start(self) -> None:
        self._accepting = True
        self._workers = [
            asyncio.create_task(self._work(), name=f"context-worker-{n}")
            for n in range(self._concurrency)
        ]

    def submit(self, request: ProcessRequest) -> bool:
        """Queue ``request``; ``False`` (counted) when the queue is full or the pool is
        stopping."""
        if not self._accepting:
            self._rejected_stopping.inc()
            return False
        try:
            self._queue.put_nowait(request)
        except asyncio.QueueFull:
            self._rejected_full.inc()
            return False
        return True

    @property
    def queued(self) -> int:
        return self._queue.qsize()

    def retry_after_seconds(self) -> int:
        """Seconds a refused caller should wait (the ``Retry-After`` of a 503): the time the
        queue needs to get down to half full, in whole seconds within
        ``MIN_RETRY_AFTER_SECONDS`` .. ``MAX_RETRY_AFTER_SECONDS``.

        Half full: callers coming back then find room while the other half still keeps every
        worker task busy, so a burst neither waits on an idle pool nor retries into a full
        one. The drain rate is the sum of each task's: one request per mean time of the latest
        requests, or per the age of the task's running request once that is past
        ``SLOW_REQUEST_SECONDS`` and the mean. So a pool whose work hangs asks for longer and
        longer waits, one slow request does not count as every task being slow, neither an
        idle spell nor the start of a burst counts as slowness, and the result is rounded to
        the nearest second. Before anything finished a request is assumed to take
        ``ASSUMED_REQUEST_SECONDS``; while stopping the answer is
        ``DEFAULT_RETRY_AFTER_SECONDS``.
        """
        if not self._accepting:
            return DEFAULT_RETRY_AFTER_SECONDS
        if self._durations:
            mean = max(sum(self._durations) / len(self._durations), 1e-3)
        else:
            mean = ASSUMED_REQUEST_SECONDS
        # A running request counts as slow only past a second (and past the mean): a burst
        # starts every task at once, and their common age then says nothing about a hang.
        slow_after = max(mean, SLOW_REQUEST_SECONDS)
        now = time.monotonic()
        ages = [now - started for _, started in self._in_flight.values()]
        idle_tasks = max(self._concurrency - len(ages), 0)
        drain_per_second = (idle_tasks + sum(age <= slow_after for age in ages)) / mean + sum(
            1 / age for age in ages if age > slow_after
        )
        # Nearest whole second: "about a second" is 1, not 2.
        seconds = math.floor(self._queue.qsize() / 2 / drain_per_second + 0.5)
        return min(max(seconds, MIN_RETRY_AFTER_SECONDS), MAX_RETRY_AFTER_SECONDS)

    async def join(self) -> None:
        """Wait until every queued request has been handled (tests, the demo)."""
        await self._queue.join()

    async def stop(self, grace_seconds: float) -> list[int]:
        """Stop accepting, drop queued requests (their stages are still ``PENDING``, so the
        rescan re-requests them sooner than a reclaim could), let running work finish for up
        to ``grace_seconds``, then cancel it. Returns the abandoned context ids and logs them
        in one WARNING (FC-02). A cancelled save rolls back whole: nothing is half-applied.
        """
        self._accepting = False
        abandoned: list[int] = []
        while not self._queue.empty():
            abandoned.append(self._queue.get_nowait().context_id)
            self._queue.task_done()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), timeout=grace_seconds)
        abandoned.extend(context_id for context_id, _ in self._in_flight.values())
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []
        if abandoned:
            logger.warning(
                "shutdown abandoned %d contexts to the rescan: context_ids=%s",
                len(abandoned),
                sorted(abandoned),
            )
        return sorted(abandoned)

    async def _work(self) -> None:
        current = asyncio.current_task()
        assert current is not None
        while True:
            request = await self._queue.get()
            started = time.monotonic()
            self._in_flight[current] = (request.context_id, started)
            try:
                with (
                    tracing.span(
                        "process context",
                        parent=request.trace_context,
                        context_id=request.context_id,
                    ),
                    log_context(context_id=request.context_id),
                ):
                    await self._handler(request)
            except TransientError as exc:
                logger.warning(
                    "context not processed, left for the rescan: context_id=%d cause=%s",
                    request.context_id,
                    type(exc).__name__,
                )
            except Exception as exc:
                # Last line of defence (FC-01): the worker survives and says which context.
                logger.error(
                    "context processing crashed: context_id=%d cause=%s",
                    request.context_id,
                    type(exc).__name__,
                    exc_info=exc,
                )
            finally:
                self._in_flight.pop(current, None)
                self._durations.append(time.monotonic() - started)
                self._queue.task_done()
