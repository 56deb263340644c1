"""Personal search (§7): embed the whole query once, exact cosine over the user's contexts.

Errors carry fixed messages naming the layer, for the HTTP mapping in ``main.py`` (§6):
``ProfileMismatchError`` / ``InvalidInputError`` -> 422, ``PermanentError`` -> 502,
``TransientError`` -> 503: a provider-wide fault too (never 502), and
``ProviderGateClosed`` while the embedding provider is unavailable, with the gate's
``Retry-After``. Neither the query nor upstream text reaches a log or a message.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from app.errors import (
    InvalidInputError,
    PermanentError,
    ProfileMismatchError,
    ProviderGateClosed,
    ProviderUnavailableError,
    TransientError,
)
from app.metrics import WorkerMetrics, search_outcome
from app.providers.base import EmbeddingProvider
from app.repository import context_embedding
from app.repository.context_embedding import SearchAdditions, SearchHit, SimilarRecords
from app.repository.db import client_autocommit
from app.service import context_text
from app.service.provider_gate import ProviderGate
from pinlog_platform.contract.search import SearchCuts
from pinlog_platform.db.sqlstates import worth_one_retry

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SearchAnswer:
    """The §7 list (``hits``), the presets the query matched (``matched_keyword_ids``), and,
    when the request named ``contextIds``, the additions of the core's fused search."""

    hits: list[SearchHit]
    matched_keyword_ids: list[int]
    additions: SearchAdditions | None = None


class SearchService:
    """Personal search over one profile; each search's latency (seconds) is observed in
    ``pinlog_search_seconds`` by outcome (``app.metrics.search_outcome``)."""

    def __init__(
        self,
        engine: AsyncEngine,
        provider: EmbeddingProvider,
        gate: ProviderGate,
        *,
        metrics: WorkerMetrics,
        profile: str,
        max_input_chars: int,
        cuts: SearchCuts,
        keyword_match_threshold: float,
        keyword_match_top: int = 0,
    ) -> None:
        self._engine = engine
        self._provider = provider
        self._gate = gate
        self._profile = profile
        self._max_input_chars = max_input_chars
        self._latency = metrics.search
        self._cuts = cuts
        self._keyword_match_threshold = keyword_match_threshold
        self._keyword_match_top = keyword_match_top

    async def search(
        self,
        *,
        user_id: int,
        query: str,
        limit: int,
        embedding_profile: str,
        context_ids: list[int] | None = None,
    ) -> SearchAnswer:
        """Up to ``limit`` records of ``user_id``, one per record (its best context), by
        descending cosine similarity clamped to [-1, 1], then the configured cuts (none by
        default: §7's exact set); each says whether a keyword visible to the owner matches the
        query (``keyword_matched``). With ``context_ids`` (the core's fused search, §7
        Addition), also their cosines and the keyword hits, in a second statement; without,
        the cost of §7's list alone. Raises as described in the module docstring.
        """
        started = time.perf_counter()
        try:
            hits = await self._search(user_id, query, limit, embedding_profile, context_ids)
        except Exception as exc:
            self._latency[search_outcome(exc)].observe(time.perf_counter() - started)
            raise
        self._latency["ok"].observe(time.perf_counter() - started)
        return hits

    async def _nearest(
        self, user_id: int, vector, limit: int, context_ids: list[int] | None
    ) -> tuple[SimilarRecords, SearchAdditions | None]:
        async with client_autocommit(self._engine) as conn:
            similar = await context_embedding.search_similar(
                conn,
                user_id=user_id,
                query=vector,
                profile=self._profile,
                limit=limit,
                keyword_match_threshold=self._keyword_match_threshold,
                keyword_match_top=self._keyword_match_top,
            )
            if context_ids is None:
                return similar, None
            additions = await context_embedding.search_additions(
                conn,
                user_id=user_id,
                query=vector,
                profile=self._profile,
                context_ids=context_ids,
                matched_ids=similar.matched_ids,
                limit=limit,
            )
            return similar, additions

    async def _search(
        self,
        user_id: int,
        query: str,
        limit: int,
        embedding_profile: str,
        context_ids: list[int] | None,
    ) -> SearchAnswer:
        if embedding_profile != self._profile:
            logger.warning(
                "search profile mismatch: requested=%s server=%s",
                embedding_profile,
                self._profile,
            )
            raise ProfileMismatchError("embedding profile mismatch")
        try:
            text = context_text.prepare_for_embedding(query, max_chars=self._max_input_chars)
        except InvalidInputError as exc:
            raise InvalidInputError(f"query {exc}") from None
        try:
            (vector,) = await self._gate.call(lambda: self._provider.embed([text]))
        except ProviderGateClosed as exc:
            # Refused without a call while the embedding provider is unavailable.
            raise ProviderGateClosed(
                "embedding upstream unavailable", retry_after_seconds=exc.retry_after_seconds
            ) from None
        except ProviderUnavailableError as exc:
            # Provider-wide (key, quota, model, parameter): 503 like any outage, never 502.
            logger.error(
                "search embedding provider-wide fault: status=%s code=%s type=%s param=%s "
                "reason=%s",
                exc.status,
                exc.code,
                exc.error_type,
                exc.param,
                exc.reason,
            )
            raise TransientError("embedding upstream unavailable") from None
        except TransientError as exc:
            logger.warning("search embedding transient failure: cause=%s", exc)
            raise TransientError("embedding upstream unavailable") from None
        except InvalidInputError:
            # The model says the query is too long: the caller's input, 422 like our own check.
            logger.warning("search query longer than the embedding model accepts")
            raise InvalidInputError("query text is longer than the model accepts") from None
        except PermanentError as exc:
            logger.error("search embedding permanent failure: cause=%s", exc)
            raise PermanentError("embedding upstream failed") from None
        try:
            try:
                similar, additions = await self._nearest(user_id, vector, limit, context_ids)
            except TransientError as exc:
                if not worth_one_retry(exc):
                    raise
                # A read on a connection that could not serve (it died while pooled, or sits
                # on a read-only server): once more on a fresh one (§6).
                similar, additions = await self._nearest(user_id, vector, limit, context_ids)
        except TransientError as exc:
            # The log names the cause (lock timeout or unavailable); the body stays fixed (§6).
            logger.warning("search database transient failure: cause=%s", type(exc).__name__)
            raise TransientError("database unavailable") from None
        return SearchAnswer(self._cuts.apply(text, similar.hits), similar.matched_ids, additions)
