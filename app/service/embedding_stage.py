"""The embedding stage of §3.2: reuse, claim, provider call outside transactions, save."""

from __future__ import annotations

import logging

import numpy as np
from sqlalchemy.ext.asyncio import AsyncEngine

from app import metrics
from app.errors import ProviderRefusedError
from app.providers.base import EmbeddingProvider
from app.repository import results
from app.repository.context_ai_state import ContextProgress
from app.repository.results import SaveOutcome
from app.service import context_text
from app.service.circuit_breaker import CircuitBreaker
from app.service.requests import ProcessRequest
from app.service.stage_claim import run_claimed
from app.states import Stage, Status

logger = logging.getLogger(__name__)
STAGE = Stage.EMBEDDING


class EmbeddingStage:
    def __init__(
        self,
        engine: AsyncEngine,
        provider: EmbeddingProvider,
        breaker: CircuitBreaker,
        *,
        profile: str,
        dimension: int,
        expiry_seconds: float,
        max_input_chars: int,
    ) -> None:
        self._engine = engine
        self._provider = provider
        self._breaker = breaker
        self._profile = profile
        self._dimension = dimension
        self._expiry_seconds = expiry_seconds
        self._max_input_chars = max_input_chars

    async def run(self, request: ProcessRequest, progress: ContextProgress) -> np.ndarray | None:
        """Return the context's vector (float32, ``(dimension,)``) for the keyword stage, or
        ``None`` when this request did not produce or may not reuse one.

        Never raises: every error is settled by the §6 rules in ``stage_failure``.
        """
        if (
            progress.embedding_status is Status.COMPLETED
            and progress.embedding is not None
            and progress.embedding_profile == self._profile
        ):
            metrics.STAGE_OUTCOMES.labels(STAGE.label, "reused").inc()
            return progress.embedding
        if progress.embedding_status not in (Status.PENDING, Status.PROCESSING):
            return None
        return await run_claimed(
            self._engine,
            STAGE,
            request.context_id,
            expiry_seconds=self._expiry_seconds,
            work=lambda attempt: self._produce_and_save(request, attempt),
        )

    async def _produce_and_save(self, request: ProcessRequest, attempt: int) -> np.ndarray | None:
        text = context_text.prepare_for_embedding(request.text, max_chars=self._max_input_chars)
        # The provider call runs with no transaction and no connection held (§3.2, FC-03).
        (vector,) = await self._breaker.call(lambda: self._provider.embed([text]))
        if vector.shape != (self._dimension,):
            raise ProviderRefusedError(
                f"embedding dimension {vector.shape[-1]} differs from configured {self._dimension}"
            )
        outcome = await results.save_embedding(
            self._engine,
            context_id=request.context_id,
            attempt=attempt,
            user_id=request.user_id,
            record_id=request.record_id,
            embedding=vector,
            embedding_profile=self._profile,
        )
        if outcome is SaveOutcome.DISCARDED:
            metrics.STAGE_OUTCOMES.labels(STAGE.label, "discarded").inc()
            logger.info("embedding result discarded: context_id=%d", request.context_id)
            return None
        metrics.STAGE_OUTCOMES.labels(STAGE.label, "completed").inc()
        logger.info("embedding completed: context_id=%d", request.context_id)
        return vector
