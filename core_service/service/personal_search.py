"""Personal search for a member (§7 and its Additions in docs/contract.md; docs/search.md):
three lists fused by rank, the core re-checks every hit.

1. The core analyses the query (``SearchAnalyser``, in a thread) and, in one statement, runs
   the *lexical* list (BM25 over the member's live notes' terms) and the keyword list's *name
   matches* (records carrying a preset whose name or examples share a term with the query).
2. It calls the worker's ``POST /internal/v1/search`` once, with the member as ``userId``, the
   embedding profile in use (``profile_in_use``), on an instance serving that profile
   (``worker_routing``), and the contexts its lists found as ``contextIds``: the *semantic*
   list (§7), the cosines of those contexts and the worker's *keyword hits*.
3. One statement re-checks every context on the primary (the member owns it and its record,
   neither is deleted) before anything is shown, so a list read from a lagging replica
   (step 1 may run on one: ``lists_engine``) never shows a note deleted on the primary; it
   also reads each record's place and the keywords its owner sees; reciprocal rank fusion
   ranks the records; the cuts (``pinlog_platform.contract.search``) apply to results only
   the semantic list found.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import orjson
from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.errors import CoreError, UnavailableError, UpstreamError
from core_service.repository import context_search
from core_service.repository.db import autocommit
from core_service.service.context_body import normalize_body
from core_service.service.profile_in_use import ProfileInUse
from core_service.service.search_terms import SearchAnalyser
from core_service.service.worker_endpoints import WorkerAnswer, WorkerEndpoints, WorkerUnanswered
from pinlog_platform.contract.search import SearchCuts, clamp_similarity
from pinlog_platform.contract.search.fusion import (
    KEYWORD,
    LEXICAL,
    LIST_ORDER,
    RRF_K,
    SEMANTIC,
    apply_cuts,
    fuse,
)

logger = logging.getLogger(__name__)

SEARCH_PATH = "/internal/v1/search"
# Embedding the query is a provider call: allow it more than a dispatch's 3 s.
SEARCH_CONNECT_TIMEOUT_SECONDS = 1.0
SEARCH_READ_TIMEOUT_SECONDS = 10.0
# The whole answer, however slowly its bytes arrive (the read timeout times each wait for
# bytes, not the answer).
SEARCH_DEADLINE_SECONDS = 12.0
# The lexical list keeps records scoring at least this share of the best one's BM25 score,
# chosen on the development queries (bench/member_search_quality.py; docs/search.md).
LEXICAL_FLOOR_SHARE = 0.45
# The worker accepts at most this many contextIds (§7 Addition).
MAX_CONTEXT_IDS = 200
# How long the presets' names and examples (name matching) are reused before a re-read.
PRESET_NAMES_CACHE_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One record in the fused ranking: its ``context_id`` (the record's matching live context
    with the highest cosine, else the newest), ``similarity`` (that context's cosine to the
    query clamped to -1..1, ``None`` without a live vector of the profile in use),
    ``keyword_matched`` (§7), ``matched_by`` (lists in ``LIST_ORDER``), the fused ``score``
    and what the record shows (``shown``: its place and the keywords its owner sees, read with
    the re-check)."""

    record_id: int
    context_id: int
    similarity: float | None
    keyword_matched: bool = False
    matched_by: tuple[str, ...] = (SEMANTIC,)
    score: float = 0.0
    shown: context_search.ShownRecord | None = None  # the record's place and keywords


def _worker_id(value: object) -> int:
    """An id of the worker's answer: a JSON integer (never a string or a float ``int()`` would
    coerce); ``ValueError`` otherwise."""
    if type(value) is not int:
        raise ValueError("id is not an integer")
    return value


@dataclass(frozen=True, slots=True)
class _WorkerLists:
    semantic: list[tuple[int, int, float, bool]]  # record, context, similarity, matched
    similarities: dict[int, float]  # context -> cosine
    keyword_hits: list[tuple[int, int, float, float]]  # record, context, similarity, confidence


def _parsed(answer: WorkerAnswer) -> _WorkerLists:
    """The worker's lists; ``UpstreamError`` (502) for an answer not of §7's shape."""
    try:
        body = orjson.loads(answer.body)
        semantic = [
            (
                _worker_id(item["recordId"]),
                _worker_id(item["contextId"]),
                clamp_similarity(float(item["similarity"])),
                item.get("keywordMatched", False) is True,
            )
            for item in body["results"]
        ]
        similarities = {
            _worker_id(item["contextId"]): clamp_similarity(float(item["similarity"]))
            for item in body.get("contextSimilarities") or ()
        }
        keyword_hits = [
            (
                _worker_id(item["recordId"]),
                _worker_id(item["contextId"]),
                clamp_similarity(float(item["similarity"])),
                float(item.get("confidence") or 0.0),
            )
            for item in body.get("keywordHits") or ()
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        logger.error("search: malformed answer from the worker (%s)", type(exc).__name__)
        raise UpstreamError("search failed") from None
    ids = [i for hit in semantic for i in hit[:2]] + list(similarities)
    ids += [i for hit in keyword_hits for i in hit[:2]]
    if not all(0 < i < 2**63 for i in ids):
        logger.error("search: ids out of range in the worker's answer")
        raise UpstreamError("search failed")
    return _WorkerLists(semantic, similarities, keyword_hits)


class PresetNames:
    """Which visible presets a query names (their display name or an example shares a term
    with the query): read and analysed at most every ``PRESET_NAMES_CACHE_SECONDS``."""

    def __init__(self, engine: AsyncEngine, analyser: SearchAnalyser) -> None:
        self._engine = engine
        self._analyser = analyser
        self._by_term: dict[str, frozenset[int]] = {}
        self._read_at = -PRESET_NAMES_CACHE_SECONDS
        self._lock = asyncio.Lock()

    async def named(self, terms: list[str]) -> list[int]:
        """Ids of the presets ``terms`` name, ascending; the last list read when a re-read
        fails (never raises)."""
        if time.monotonic() - self._read_at >= PRESET_NAMES_CACHE_SECONDS:
            await self._refresh()
        found: set[int] = set()
        for term in terms:
            found |= self._by_term.get(term, frozenset())
        return sorted(found)

    async def _refresh(self) -> None:
        async with self._lock:
            started = time.monotonic()
            if started - self._read_at < PRESET_NAMES_CACHE_SECONDS:
                return
            try:
                async with autocommit(self._engine) as conn:
                    presets = await context_search.visible_presets(conn)
            except CoreError as exc:
                self._read_at = time.monotonic()
                logger.warning("preset names not read (%s)", type(exc).__name__)
                return
            by_term: dict[str, set[int]] = {}
            owners = [preset_id for preset_id, name, examples in presets for _ in (name, *examples)]
            texts = [text for _, name, examples in presets for text in (name, *examples)]
            for preset_id, terms in zip(
                owners, await self._analyser.terms_of_each(texts), strict=True
            ):
                for term in terms.terms:
                    by_term.setdefault(term, set()).add(preset_id)
            self._by_term = {term: frozenset(ids) for term, ids in by_term.items()}
            self._read_at = started


class PersonalSearch:
    def __init__(
        self,
        engine: AsyncEngine,
        endpoints: WorkerEndpoints,
        *,
        profile_in_use: ProfileInUse,
        cuts: Callable[[str], SearchCuts],
        analyser: SearchAnalyser,
        lexical_floor_share: float = LEXICAL_FLOOR_SHARE,
        rrf_k: int = RRF_K,
        lists_engine: AsyncEngine | None = None,
    ) -> None:
        self._engine = engine
        # The core's lists may come from a replica (PINLOG_CORE_SEARCH_DATABASE_URL); the
        # re-check of what is shown always reads ``engine``, the primary.
        self._lists_engine = lists_engine or engine
        self._endpoints = endpoints
        self._profile_in_use = profile_in_use
        self._cuts = cuts
        self._analyser = analyser
        self._preset_names = PresetNames(engine, analyser)
        self._lexical_floor_share = lexical_floor_share
        self._rrf_k = rrf_k

    async def search(self, *, member_id: int, query: str, limit: int) -> list[SearchHit]:
        """Up to ``limit`` of the member's own live records, best fused score first, after the
        cuts on semantic-only results (module docstring; docs/contract.md §7 Additions and
        Deviation). Round trips: one statement before the worker call, one after (the preset
        names and the profile in use are cached).

        Raises ``InvalidBodyError`` (422: blank or over-long query), ``UnavailableError``
        (503: worker or database unavailable), ``UpstreamError`` (502: the worker refused).
        """
        normalised = normalize_body(query, field="query")
        terms = list((await self._analyser.terms(normalised)).terms)
        named_ids = await self._preset_names.named(terms)
        profile = await self._profile_in_use.current()
        async with autocommit(self._lists_engine) as conn:
            core_lists = await context_search.search_lists(
                conn,
                member_id=member_id,
                terms=terms,
                named_ids=named_ids,
                floor_share=self._lexical_floor_share,
                limit=limit,
            )
        found = [hit.context_id for hit in core_lists.lexical + core_lists.named]
        payload = {
            "userId": member_id,
            "query": normalised,
            "limit": limit,
            "embeddingProfile": profile,
            "contextIds": list(dict.fromkeys(found))[:MAX_CONTEXT_IDS],
        }
        worker = _parsed(await self._ask_a_worker(payload, profile))
        candidates = (
            [(h.record_id, h.context_id) for h in core_lists.lexical + core_lists.named]
            + [(r, c) for r, c, _, _ in worker.semantic]
            + [(r, c) for r, c, _, _ in worker.keyword_hits]
        )
        if not candidates:
            return []
        async with autocommit(self._engine) as conn:
            rechecked = await context_search.recheck(
                conn, member_id=member_id, context_ids=sorted({c for _, c in candidates})
            )
        ranked = self._ranked(normalised, profile, core_lists, worker, rechecked.allowed, limit)
        return [replace(hit, shown=rechecked.records[hit.record_id]) for hit in ranked]

    def _ranked(
        self,
        query: str,
        profile: str,
        core_lists: context_search.CoreLists,
        worker: _WorkerLists,
        allowed: set[tuple[int, int]],
        limit: int,
    ) -> list[SearchHit]:
        """Fusion over the re-checked hits (``allowed``: (context, record) pairs)."""
        cosine = dict(worker.similarities)
        for _, context_id, similarity, _ in worker.semantic:
            cosine[context_id] = similarity
        for _, context_id, similarity, _ in worker.keyword_hits:
            cosine.setdefault(context_id, similarity)
        keyword_matched = {r for r, _, _, matched in worker.semantic if matched}
        keyword_matched |= {r for r, _, _, _ in worker.keyword_hits}
        lists: dict[str, list[int]] = {name: [] for name in LIST_ORDER}
        contexts: dict[int, set[int]] = {}  # record -> its matching live contexts

        def add(name: str, record_id: int, context_id: int) -> None:
            # Trust nothing but ids the core confirms as a pair; a record once per list.
            if (context_id, record_id) not in allowed:
                return
            contexts.setdefault(record_id, set()).add(context_id)
            if record_id not in lists[name]:
                lists[name].append(record_id)

        for hit in core_lists.lexical:
            add(LEXICAL, hit.record_id, hit.context_id)
        for record_id, context_id, _, _ in worker.semantic:
            add(SEMANTIC, record_id, context_id)
        # The keyword list: name matches and the worker's hits, best confidence first.
        keyword = [(h.score, h.record_id, h.context_id) for h in core_lists.named]
        keyword += [(conf, r, c) for r, c, _, conf in worker.keyword_hits]
        for _, record_id, context_id in sorted(keyword, key=lambda k: (-k[0], k[1], k[2])):
            add(KEYWORD, record_id, context_id)
        best_context = {
            record_id: max(ids, key=lambda c: (cosine.get(c) is not None, cosine.get(c, 0), c))
            for record_id, ids in contexts.items()
        }
        similarity = {r: cosine.get(c) for r, c in best_context.items()}
        fused = apply_cuts(query, fuse(lists, k=self._rrf_k), similarity, self._cuts(profile))
        return [
            SearchHit(
                f.record_id,
                best_context[f.record_id],
                similarity[f.record_id],
                f.record_id in keyword_matched,
                f.matched_by,
                f.score,
            )
            for f in fused[:limit]
        ]

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
