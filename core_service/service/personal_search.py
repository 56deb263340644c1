"""Personal search for a member (§7): the worker ranks, the core re-checks.

The worker's ``POST /internal/v1/search`` is called with the member as ``userId`` and the
embedding profile in use (``profile_in_use``), on an instance serving that profile
(``worker_routing``); every hit is then re-checked in core (the member owns the record and the
context, neither is deleted) before it is shown. The cuts are the profile's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import orjson
from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.errors import UnavailableError, UpstreamError
from core_service.repository import context
from core_service.repository.db import autocommit
from core_service.service.context_body import normalize_body
from core_service.service.profile_in_use import ProfileInUse
from core_service.service.worker_endpoints import WorkerAnswer, WorkerEndpoints, WorkerUnanswered
from pinlog_platform.contract.search import SearchCuts, clamp_similarity

logger = logging.getLogger(__name__)

SEARCH_PATH = "/internal/v1/search"
# Embedding the query is a provider call: allow it more than a dispatch's 3 s.
SEARCH_CONNECT_TIMEOUT_SECONDS = 1.0
SEARCH_READ_TIMEOUT_SECONDS = 10.0
# The whole answer, however slowly its bytes arrive (the read timeout times each wait for
# bytes, not the answer).
SEARCH_DEADLINE_SECONDS = 12.0


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One record's best context; ``similarity`` is cosine clamped to -1..1;
    ``keyword_matched`` as the worker says (§7), false when it does not say."""

    record_id: int
    context_id: int
    similarity: float
    keyword_matched: bool = False


def _worker_id(value: object) -> int:
    """An id of the worker's answer: a JSON integer (never a string or a float ``int()`` would
    coerce); ``ValueError`` otherwise."""
    if type(value) is not int:
        raise ValueError("id is not an integer")
    return value


def _parsed_hits(answer: WorkerAnswer) -> list[SearchHit]:
    """The worker's hits; ``UpstreamError`` (502) for an answer not of §7's shape."""
    try:
        hits = [
            SearchHit(
                _worker_id(item["recordId"]),
                _worker_id(item["contextId"]),
                clamp_similarity(float(item["similarity"])),
                item.get("keywordMatched", False) is True,
            )
            for item in orjson.loads(answer.body)["results"]
        ]
    except (ValueError, KeyError, TypeError) as exc:
        logger.error("search: malformed answer from the worker (%s)", type(exc).__name__)
        raise UpstreamError("search failed") from None
    if not all(0 < hit.record_id < 2**63 and 0 < hit.context_id < 2**63 for hit in hits):
        logger.error("search: ids out of range in the worker's answer")
        raise UpstreamError("search failed")
    return hits


class PersonalSearch:
    def __init__(
        self,
        engine: AsyncEngine,
        endpoints: WorkerEndpoints,
        *,
        profile_in_use: ProfileInUse,
        cuts: Callable[[str], SearchCuts],
    ) -> None:
        self._engine = engine
        self._endpoints = endpoints
        self._profile_in_use = profile_in_use
        self._cuts = cuts

    async def search(self, *, member_id: int, query: str, limit: int) -> list[SearchHit]:
        """Up to ``limit`` of the member's own live records, best first, after the cuts
        (``pinlog_platform.contract.search``; the Deviation of docs/contract.md §7).

        Raises ``InvalidBodyError`` (422: blank or over-long query), ``UnavailableError``
        (503: worker or database unavailable), ``UpstreamError`` (502: the worker refused).
        """
        normalised = normalize_body(query, field="query")
        profile = await self._profile_in_use.current()
        payload = {
            "userId": member_id,
            "query": normalised,
            "limit": limit,
            "embeddingProfile": profile,
        }
        hits = _parsed_hits(await self._ask_a_worker(payload, profile))
        if not hits:
            return []
        async with autocommit(self._engine) as conn:
            allowed = await context.filter_active_owned(
                conn, member_id=member_id, context_ids=[hit.context_id for hit in hits]
            )
        # Trust nothing but ids the core confirms as a pair; one row per record (§7).
        shown, seen_records = [], set()
        for hit in hits:
            if (hit.context_id, hit.record_id) in allowed and hit.record_id not in seen_records:
                seen_records.add(hit.record_id)
                shown.append(hit)
        return self._cuts(profile).apply(normalised, shown)

    async def _ask_a_worker(self, payload: dict[str, object], profile: str) -> WorkerAnswer:
        """The first 200 from the instances serving ``profile``, in turn; an instance that is
        unreachable, answers 503, or 422 (it serves another profile: its knowledge was stale)
        is skipped. ``UnavailableError`` when none answered, ``UpstreamError`` for any other
        status, or when every instance answered 422 (no worker serves the profile in use: a
        deployment error)."""
        wrong_profile = 0
        for endpoint in self._endpoints.in_turn(profile):
            try:
                answer = await endpoint.post_json(
                    SEARCH_PATH,
                    payload,
                    deadline_seconds=SEARCH_DEADLINE_SECONDS,
                    connect_timeout_seconds=SEARCH_CONNECT_TIMEOUT_SECONDS,
                    read_timeout_seconds=SEARCH_READ_TIMEOUT_SECONDS,
                )
            except WorkerUnanswered as failed:
                logger.warning("search: a worker is unreachable (%s)", failed.cause)
                continue
            if answer.status == 503:
                continue
            if answer.status == 422:
                wrong_profile += 1
                continue
            if answer.status != 200:
                logger.error("search: worker answered HTTP %d", answer.status)
                raise UpstreamError("search failed")
            return answer
        if wrong_profile:
            logger.error("search: no worker serves embedding profile %s", profile)
            raise UpstreamError("search failed")
        raise UnavailableError("search unavailable")
