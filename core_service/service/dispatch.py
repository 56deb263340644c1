"""After-commit requests to the worker's ``POST /internal/v1/context/process`` (§9).

A dispatch is never part of a transaction and never writes state. It tries the worker
instances in turn (``WorkerEndpoints``); when every one refused or failed (connection refused,
timeout, non-2xx including the worker's 503), it logs one WARNING without the note and leaves
the row ``PENDING`` for the rescan. Pooled clients with short timeouts (connect 1 s, read 3 s
by default).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from enum import StrEnum

import httpx

from core_service.metrics import CoreMetrics
from core_service.service.worker_endpoints import WorkerEndpoints
from pinlog_platform.logging import log_context

logger = logging.getLogger(__name__)

PROCESS_PATH = "/internal/v1/context/process"


@dataclass(frozen=True, slots=True)
class DispatchRequest:
    """What the worker needs for one context (§3); ``body`` is the stored, normalised note."""

    context_id: int
    member_id: int
    record_id: int
    body: str
    external_place_id: str
    place_name: str

    def as_json(self) -> dict[str, object]:
        return {
            "contextId": self.context_id,
            "userId": self.member_id,
            "recordId": self.record_id,
            "text": self.body,
            "placeMeta": {"externalPlaceId": self.external_place_id, "name": self.place_name},
        }


class DispatchResult(StrEnum):
    ACCEPTED = "accepted"  # 2xx: queued by the worker
    REFUSED = "refused"  # any other status, e.g. 503 queue full
    UNREACHABLE = "unreachable"  # connection error or timeout


class WorkerDispatcher:
    """Sends process requests; ``dispatch`` awaits one, ``dispatch_soon`` runs it in the
    background so a slow or dead worker never delays a user's response."""

    def __init__(
        self,
        endpoints: WorkerEndpoints,
        metrics: CoreMetrics,
        *,
        attempt_deadline_seconds: float = 5.0,
    ) -> None:
        self._endpoints = endpoints
        # httpx's read timeout bounds each read, not the whole answer: a worker dripping bytes
        # would hold a dispatch (and a rescan pass) forever without this deadline per attempt.
        self._attempt_deadline_seconds = attempt_deadline_seconds
        self._metrics = metrics
        self._in_flight: set[asyncio.Task[DispatchResult]] = set()

    async def dispatch(self, request: DispatchRequest, *, origin: str) -> DispatchResult:
        """POST one request to the first worker instance that accepts it; never raises for
        worker or network faults (they are logged).

        ``origin`` labels the metric: ``commit`` (after a create or edit) or ``rescan``.
        """
        with log_context(context_id=request.context_id):
            result = await self._first_acceptance(request)
        self._metrics.dispatches.labels(origin, result.value).inc()
        return result

    async def _first_acceptance(self, request: DispatchRequest) -> DispatchResult:
        result, causes = DispatchResult.UNREACHABLE, []
        for client in self._endpoints.in_turn():
            try:
                async with asyncio.timeout(self._attempt_deadline_seconds):
                    response = await client.post(PROCESS_PATH, json=request.as_json())
            except (httpx.HTTPError, TimeoutError) as exc:
                causes.append(type(exc).__name__)
                continue
            if response.is_success:
                result = DispatchResult.ACCEPTED
                break
            result = DispatchResult.REFUSED
            causes.append(f"HTTP {response.status_code}")
        if result is not DispatchResult.ACCEPTED:
            logger.warning(
                "dispatch of context %d failed (%s); left PENDING for the rescan",
                request.context_id,
                ", ".join(causes),
            )
        elif causes:
            logger.info(
                "dispatch of context %d skipped %d worker(s) (%s)",
                request.context_id,
                len(causes),
                ", ".join(causes),
            )
        return result

    def dispatch_soon(self, request: DispatchRequest) -> None:
        """Start ``dispatch`` in the background (after a commit) and return at once."""
        task = asyncio.create_task(self.dispatch(request, origin="commit"))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    async def drain(self, timeout_seconds: float) -> None:
        """Wait up to ``timeout_seconds`` for background dispatches, then cancel the rest
        (their contexts stay ``PENDING``; the rescan re-requests them)."""
        if not self._in_flight:
            return
        _done, pending = await asyncio.wait(set(self._in_flight), timeout=timeout_seconds)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
