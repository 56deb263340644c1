"""Requests to the worker's ``POST /internal/v1/context/process`` (§9 "After-commit dispatch").

A dispatch is never part of a transaction. It tries the worker instances in turn
(``WorkerEndpoints``) and classifies what happened (``DispatchResult``):

- the worker **took** it: ``202``, or a timeout after the request was sent (the worker may
  have queued it; counting it keeps a slow worker from being flooded by resends), or it
  **rejected** it for good (``422``, any other answer but the ones below). Such a dispatch
  ran, so it is counted: a context's first is free, each later one spends one ``retry_count``
  (``context_ai_state.record_accepted_dispatch``, its own statement after the answer);
- the worker **refused** it (``503``, and ``429``/``502``/``504`` from a proxy in front) or
  could **not be reached** (connection refused, reset or timed out before the request was
  sent): nothing is written, the row stays ``PENDING`` and is tried again later;
- ``401``/``403``: the shared secret is wrong, a configuration fault: an ERROR line and the
  ``unauthorized`` result, nothing written, nothing counted.

docs/rescan.md "Budget" is the rule; a core that dies between the ``202`` and the counting
statement leaves that one attempt uncounted. Log lines name the context id and the error
class, never the note. Pooled clients with short timeouts (connect 1 s, read 3 s by default).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.errors import CoreError
from core_service.metrics import CoreMetrics
from core_service.repository import context_ai_state
from core_service.repository.db import autocommit
from core_service.service.worker_endpoints import WorkerEndpoints
from pinlog_platform.logging import log_context

logger = logging.getLogger(__name__)

PROCESS_PATH = "/internal/v1/context/process"
# Answers that mean "not now" (a full queue, a proxy without a healthy upstream), not a verdict.
_REFUSAL_STATUSES = frozenset({429, 502, 503, 504})
# Answers that mean the worker does not trust us: X-Internal-Secret differs (§8).
_UNAUTHORIZED_STATUSES = frozenset({401, 403})
# The httpcore trace event after which the worker has the whole request.
_REQUEST_SENT_EVENT = "send_request_body.complete"


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
    """What became of one dispatch (the ``result`` label of ``pinlog_core_dispatches_total``)."""

    ACCEPTED = "accepted"  # 2xx: queued by a worker
    TIMED_OUT = "timed_out"  # sent, no answer in time: the worker may have queued it
    REJECTED = "rejected"  # answered with a verdict on the request (422, 500, ...)
    REFUSED = "refused"  # 503 and the like: not taken now
    UNREACHABLE = "unreachable"  # not sent: no connection, or it broke before the answer
    UNAUTHORIZED = "unauthorized"  # 401/403: a configuration fault

    @property
    def ran(self) -> bool:
        """A worker took the request (or judged it): the dispatch counts (docstring)."""
        return self in _RAN

    @property
    def retry_later(self) -> bool:
        """Not taken, through no fault of the note: nothing written, tried again later."""
        return self in (DispatchResult.REFUSED, DispatchResult.UNREACHABLE)


_RAN = frozenset({DispatchResult.ACCEPTED, DispatchResult.TIMED_OUT, DispatchResult.REJECTED})


@dataclass(frozen=True, slots=True)
class DispatchOutcome:
    """A dispatch's result, with the shortest ``Retry-After`` (seconds) of the refusals."""

    result: DispatchResult
    retry_after_seconds: float | None = None


class WorkerDispatcher:
    """Sends process requests and counts the ones a worker took; ``dispatch`` awaits one,
    ``dispatch_soon`` runs it in the background so a slow or dead worker never delays a
    user's response."""

    def __init__(
        self,
        endpoints: WorkerEndpoints,
        metrics: CoreMetrics,
        engine: AsyncEngine,
        *,
        max_retry: int,
        attempt_deadline_seconds: float = 5.0,
    ) -> None:
        self._endpoints = endpoints
        self._engine = engine
        self._max_retry = max_retry
        # httpx's read timeout bounds each read, not the whole answer: a worker dripping bytes
        # would hold a dispatch (and a rescan pass) forever without this deadline per attempt.
        self._attempt_deadline_seconds = attempt_deadline_seconds
        self._metrics = metrics
        self._in_flight: set[asyncio.Task[Any]] = set()

    async def dispatch(self, request: DispatchRequest, *, origin: str) -> DispatchOutcome:
        """POST one request to the first worker instance that takes it and count it if it
        ran; never raises for worker, network or database faults (they are logged).

        ``origin`` labels the metric: ``commit`` (after a create or edit) or ``rescan``.
        """
        with log_context(context_id=request.context_id):
            outcome = await self._first_taker(request)
            self._metrics.dispatches.labels(origin, outcome.result.value).inc()
            if outcome.result.ran:
                await self._count(request.context_id)
        return outcome

    async def _first_taker(self, request: DispatchRequest) -> DispatchOutcome:
        results: list[DispatchOutcome] = []
        causes: list[str] = []
        for client in self._endpoints.in_turn():
            outcome, cause = await self._attempt(client, request)
            if outcome.result.ran:
                self._log_taken(request.context_id, outcome.result, cause, causes)
                return outcome
            results.append(outcome)
            causes.append(cause)
        outcome = _combine(results)
        logger.warning(
            "dispatch of context %d not taken (%s); left PENDING, tried again later",
            request.context_id,
            ", ".join(causes),
        )
        return outcome

    async def _attempt(
        self, client: httpx.AsyncClient, request: DispatchRequest
    ) -> tuple[DispatchOutcome, str]:
        """One POST to one instance: its outcome and a short cause for the log."""
        sent = _SendProbe()
        try:
            async with asyncio.timeout(self._attempt_deadline_seconds):
                response = await client.post(
                    PROCESS_PATH, json=request.as_json(), extensions={"trace": sent.observe}
                )
        except (httpx.HTTPError, TimeoutError) as exc:
            cause = type(exc).__name__
            timed_out = isinstance(exc, (TimeoutError, httpx.TimeoutException))
            if timed_out and sent.complete:
                return DispatchOutcome(DispatchResult.TIMED_OUT), cause
            return DispatchOutcome(DispatchResult.UNREACHABLE), cause
        status = response.status_code
        cause = f"HTTP {status}"
        if response.is_success:
            return DispatchOutcome(DispatchResult.ACCEPTED), cause
        if status in _REFUSAL_STATUSES:
            return DispatchOutcome(DispatchResult.REFUSED, retry_after(response)), cause
        if status in _UNAUTHORIZED_STATUSES:
            logger.error(
                "worker %s answered %d to a process request: PINLOG_CORE_INTERNAL_SECRET does "
                "not match the worker's PINLOG_INTERNAL_SECRET; nothing is counted",
                client.base_url,
                status,
            )
            return DispatchOutcome(DispatchResult.UNAUTHORIZED), cause
        return DispatchOutcome(DispatchResult.REJECTED), cause

    @staticmethod
    def _log_taken(context_id: int, result: DispatchResult, cause: str, skipped: list[str]) -> None:
        if result is DispatchResult.TIMED_OUT:
            logger.warning(
                "dispatch of context %d timed out after it was sent (%s); counted as taken",
                context_id,
                cause,
            )
        elif result is DispatchResult.REJECTED:
            logger.warning("worker rejected context %d (%s); counted", context_id, cause)
        if skipped:
            logger.info(
                "dispatch of context %d skipped %d worker(s) (%s)",
                context_id,
                len(skipped),
                ", ".join(skipped),
            )

    async def _count(self, context_id: int) -> None:
        """The counting statement after a dispatch that ran (docs/rescan.md "Budget")."""
        try:
            async with autocommit(self._engine) as conn:
                await context_ai_state.record_accepted_dispatch(
                    conn, context_id=context_id, max_retry=self._max_retry
                )
        except CoreError as exc:
            logger.warning(
                "dispatch of context %d was taken but could not be counted (%s)",
                context_id,
                type(exc).__name__,
            )

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


class _SendProbe:
    """An httpcore ``trace`` callback noting whether the whole request went out."""

    __slots__ = ("complete",)

    def __init__(self) -> None:
        self.complete = False

    async def observe(self, event: str, _info: dict[str, Any]) -> None:
        if event.endswith(_REQUEST_SENT_EVENT):
            self.complete = True


def _combine(outcomes: list[DispatchOutcome]) -> DispatchOutcome:
    """The outcome of a round no instance took: refused (with the shortest ``Retry-After``)
    if any refused, else unreachable if any was, else unauthorized."""
    for result in (DispatchResult.REFUSED, DispatchResult.UNREACHABLE):
        matching = [outcome for outcome in outcomes if outcome.result is result]
        if matching:
            waits = [o.retry_after_seconds for o in matching if o.retry_after_seconds is not None]
            return DispatchOutcome(result, min(waits) if waits else None)
    return DispatchOutcome(DispatchResult.UNAUTHORIZED)


# A Retry-After above this is read as this: a worker never asks for longer (app/service/
# worker_pool.py caps at 60 s), and a bad proxy must not park the core's backlog for hours.
RETRY_AFTER_CAP_SECONDS = 60.0


def retry_after(response: httpx.Response) -> float | None:
    """``Retry-After`` in seconds when it is a non-negative number (RFC 9110 delay-seconds),
    capped at ``RETRY_AFTER_CAP_SECONDS``; ``None`` when absent or not a number."""
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    if not seconds >= 0:  # NaN and negatives
        return None
    return min(seconds, RETRY_AFTER_CAP_SECONDS)
