"""One round of ``POST /internal/v1/context/process`` over the worker instances, classified.

``ProcessRequestSender.send`` tries the instances in turn (``WorkerEndpoints``) until one takes
the request, and says what happened (``DispatchResult``, docs/rescan.md "Budget"):

- the worker **took** it: ``202``, or a timeout after the whole request was sent (the worker
  may have queued it), or it answered with a **verdict** on the request (``422``, or any
  status not listed below). Such a dispatch ran: it is counted;
- the worker **refused** it (``503``, and ``429``/``502``/``504`` from a proxy in front, with
  their ``Retry-After``) or could **not be reached** (connection refused, reset, or timed out
  before the request was sent; a connection that breaks after sending but before an answer is
  a worker gone with its queue): nothing is written, it is tried again later;
- ``401``/``403``: the shared secret is wrong, a configuration fault; nothing is counted;
- ``409``: the instance serves another embedding profile than the one in use (the request
  names it as ``embeddingProfile``): the next instance is tried; refused when none took it.

Each attempt's cause is ``HTTP <status>`` or the word ``WorkerUnanswered`` gives
(``ConnectError``, ``ReadTimeout``, ...; ``worker_endpoints``), the same whatever HTTP library
sends the request. No state is written here and nothing is logged: the dispatcher decides and logs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from core_service.service.profile_in_use import ProfileInUse
from core_service.service.worker_endpoints import WorkerEndpoint, WorkerEndpoints, WorkerUnanswered

PROCESS_PATH = "/internal/v1/context/process"
# Answers that mean "not now" (a full queue, a proxy without a healthy upstream), not a verdict;
# 409: this instance serves another embedding profile (a switch is under way).
_REFUSAL_STATUSES = frozenset({409, 429, 502, 503, 504})
# Answers that mean the worker does not trust us: X-Internal-Secret differs (§8).
_UNAUTHORIZED_STATUSES = frozenset({401, 403})
# A Retry-After above this is read as this: a worker never asks for longer (app/service/
# worker_pool.py caps at 60 s), and a bad proxy must not park the core's backlog for hours.
RETRY_AFTER_CAP_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class DispatchRequest:
    """What the worker needs for one context (§3); ``body`` is the stored, normalised note."""

    context_id: int
    member_id: int
    record_id: int
    body: str
    external_place_id: str
    place_name: str
    # The trace this dispatch belongs to (``pinlog_platform.tracing.current_context``), kept
    # while the request waits in the retry set; ``None`` without tracing. Not sent.
    trace_context: Any = field(default=None, compare=False, repr=False)

    def as_json(self, embedding_profile: str | None = None) -> dict[str, object]:
        """The request body; ``embedding_profile``: the profile in use, when known."""
        body: dict[str, object] = {
            "contextId": self.context_id,
            "userId": self.member_id,
            "recordId": self.record_id,
            "text": self.body,
            "placeMeta": {"externalPlaceId": self.external_place_id, "name": self.place_name},
        }
        if embedding_profile is not None:
            body["embeddingProfile"] = embedding_profile
        return body


class DispatchResult(StrEnum):
    """What became of one dispatch (the ``result`` label of ``pinlog_core_dispatches_total``)."""

    ACCEPTED = "accepted"  # 2xx: queued by a worker
    TIMED_OUT = "timed_out"  # sent, no answer in time: the worker may have queued it
    REJECTED = "rejected"  # answered with a verdict on the request (422, 500, ...)
    REFUSED = "refused"  # 503 and the like: not taken now
    UNREACHABLE = "unreachable"  # not sent: no connection, or it broke before the answer
    UNAUTHORIZED = "unauthorized"  # 401/403: a configuration fault
    HELD = "held"  # not sent: the workers refused moments ago; kept for a later try

    @property
    def ran(self) -> bool:
        """A worker took the request (or judged it): the dispatch counts."""
        return self in _RAN

    @property
    def retry_later(self) -> bool:
        """Not taken, through no fault of the note: nothing written, tried again later."""
        return self in _RETRY_LATER


_RAN = frozenset({DispatchResult.ACCEPTED, DispatchResult.TIMED_OUT, DispatchResult.REJECTED})
_RETRY_LATER = frozenset({DispatchResult.REFUSED, DispatchResult.UNREACHABLE, DispatchResult.HELD})


@dataclass(frozen=True, slots=True)
class DispatchOutcome:
    """A dispatch's result; ``retry_after_seconds`` is the shortest ``Retry-After`` among the
    refusals, ``causes`` one short item per instance tried (``HTTP 503``, ``ConnectError``) and
    ``unauthorized`` the instances that answered 401/403; ``taken_by`` the base URL of the
    instance that took it (a result that ``ran``), else ``None``."""

    result: DispatchResult
    retry_after_seconds: float | None = None
    causes: tuple[str, ...] = ()
    unauthorized: tuple[str, ...] = ()
    taken_by: str | None = None

    @property
    def recorded_outcome(self) -> str | None:
        """What the counting statement records of a dispatch that ran (``pinlog-core
        inspect``): ``accepted``, ``timed_out`` or the worker's verdict (``HTTP 422``)."""
        if not self.result.ran:
            return None
        if self.result is DispatchResult.REJECTED:
            return self.causes[-1] if self.causes else self.result.value
        return self.result.value


class ProcessRequestSender:
    """Sends one process request to the first instance that takes it (module docstring)."""

    def __init__(
        self,
        endpoints: WorkerEndpoints,
        *,
        attempt_deadline_seconds: float,
        profile_in_use: ProfileInUse | None = None,
    ) -> None:
        self._endpoints = endpoints
        # None: one profile only; requests name none and go to every instance.
        self._profile_in_use = profile_in_use
        # The read timeout bounds each wait for answer bytes, not the whole answer: a worker
        # dripping bytes would hold a dispatch (and a rescan pass) forever without this.
        self._attempt_deadline_seconds = attempt_deadline_seconds

    async def send(self, request: DispatchRequest) -> DispatchOutcome:
        """Never raises for worker or network faults."""
        results: list[tuple[DispatchResult, float | None]] = []
        causes: list[str] = []
        unauthorized: list[str] = []
        profile = None
        if self._profile_in_use is not None:
            profile = await self._profile_in_use.current()
        payload = request.as_json(profile)
        for endpoint in self._endpoints.in_turn(profile):
            result, wait, cause = await self._attempt(endpoint, payload)
            causes.append(cause)
            if result.ran:
                return DispatchOutcome(
                    result, None, tuple(causes), tuple(unauthorized), endpoint.base_url
                )
            if result is DispatchResult.UNAUTHORIZED:
                unauthorized.append(endpoint.base_url)
            results.append((result, wait))
        result, wait = _combine(results)
        return DispatchOutcome(result, wait, tuple(causes), tuple(unauthorized))

    async def _attempt(
        self, endpoint: WorkerEndpoint, payload: dict[str, object]
    ) -> tuple[DispatchResult, float | None, str]:
        try:
            answer = await endpoint.post_json(
                PROCESS_PATH, payload, deadline_seconds=self._attempt_deadline_seconds
            )
        except WorkerUnanswered as failed:
            if failed.timed_out and failed.whole_request_sent:
                return DispatchResult.TIMED_OUT, None, failed.cause
            return DispatchResult.UNREACHABLE, None, failed.cause
        status = answer.status
        cause = f"HTTP {status}"
        if 200 <= status < 300:
            return DispatchResult.ACCEPTED, None, cause
        if status in _REFUSAL_STATUSES:
            return DispatchResult.REFUSED, retry_after(answer.headers), cause
        if status in _UNAUTHORIZED_STATUSES:
            return DispatchResult.UNAUTHORIZED, None, cause
        return DispatchResult.REJECTED, None, cause


def _combine(
    results: list[tuple[DispatchResult, float | None]],
) -> tuple[DispatchResult, float | None]:
    """The result of a round no instance took: refused (with the shortest ``Retry-After``) if
    any refused, else unreachable if any was or no instance was known, else unauthorized."""
    if not results:
        return DispatchResult.UNREACHABLE, None
    for wanted in (DispatchResult.REFUSED, DispatchResult.UNREACHABLE):
        matching = [wait for result, wait in results if result is wanted]
        if matching:
            waits = [wait for wait in matching if wait is not None]
            return wanted, (min(waits) if waits else None)
    return DispatchResult.UNAUTHORIZED, None


def retry_after(headers: Mapping[str, str]) -> float | None:
    """An answer's ``Retry-After`` (``headers`` case-insensitive) in seconds when it is a
    non-negative number (RFC 9110 delay-seconds), capped at ``RETRY_AFTER_CAP_SECONDS``;
    ``None`` when absent or not a number."""
    value = headers.get("Retry-After")
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    if not seconds >= 0:  # NaN and negatives
        return None
    return min(seconds, RETRY_AFTER_CAP_SECONDS)
