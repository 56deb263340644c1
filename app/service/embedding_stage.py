"""The embedding stage of §3.2: reuse, claim, provider call outside transactions, save."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from app.errors import DimensionMismatchError
from app.metrics import WorkerMetrics
from app.providers.base import EmbeddingProvider
from app.repository import stage_saves
from app.repository.context_start import ContextStart
from app.repository.stage_pool import StagePool
from app.service import context_text
from app.service.provider_gate import ProviderGate
from app.service.requests import ProcessRequest
from app.service.stage_claim import run_claimed
from app.service.stage_limits import StageLimits
from pinlog_platform import tracing
from pinlog_platform.contract.states import Stage, Status

logger = logging.getLogger(__name__)
STAGE = Stage.EMBEDDING


def require_dimension(vector: np.ndarray, dimension: int) -> np.ndarray:
    """``vector`` when it is float ``(dimension,)``; else ``DimensionMismatchError`` (a
    permanent, provider-wide fault: nothing is stored, §5)."""
    if vector.shape != (dimension,):
        raise DimensionMismatchError(
            f"embedding dimension {vector.shape[-1]} differs from configured {dimension}"
        )
    return vector


@dataclass(frozen=True, slots=True)
class Embedded:
    """The context's vector (float32 ``(dimension,)``) for the keyword stage, and the keyword
    claim the save made in the same statement (``None``: not made, claim it separately)."""

    vector: np.ndarray
    keyword_attempt: int | None = None


class EmbeddingStage:
    """§3.2 for one request; the claim itself is part of starting the context.

    Outcomes are counted in ``metrics`` under ``stage="embedding"``.
    """

    def __init__(
        self,
        stage_pool: StagePool,
        provider: EmbeddingProvider,
        gate: ProviderGate,
        *,
        metrics: WorkerMetrics,
        limits: StageLimits,
        profile: str,
        dimension: int,
    ) -> None:
        self._stage_pool = stage_pool
        self._provider = provider
        self._gate = gate
        self._profile = profile
        self._dimension = dimension
        self._limits = limits
        self._counts = metrics.stages[STAGE]

    @property
    def profile(self) -> str:
        """The embedding profile this stage stores vectors under (§5)."""
        return self._profile

    async def run(self, request: ProcessRequest, start: ContextStart) -> Embedded | None:
        """The context's vector, or ``None`` when this request did not produce or may not
        reuse one. ``start`` carries the claim (``embedding_attempt``) or the stored vector.

        Never raises: every error is settled by the §6 rules in ``stage_failure``.
        """
        if (
            start.embedding_status is Status.COMPLETED
            and start.embedding is not None
            and start.embedding_profile == self._profile
        ):
            self._counts.reused.inc()
            return Embedded(start.embedding)
        if start.embedding_attempt is None:
            if start.embedding_status in (Status.PENDING, Status.PROCESSING):
                self._counts.not_claimed.inc()
                logger.debug(
                    "embedding not claimed: context_id=%d status=%s",
                    request.context_id,
                    start.embedding_status,
                )
            return None
        return await run_claimed(
            self._stage_pool,
            STAGE,
            request.context_id,
            limits=self._limits,
            work=lambda attempt: self._produce_and_save(request, attempt),
            counts=self._counts,
            attempt=start.embedding_attempt,
        )

    async def _produce_and_save(self, request: ProcessRequest, attempt: int) -> Embedded | None:
        text = context_text.prepare_for_embedding(
            request.text, max_chars=self._limits.max_input_chars
        )
        # The provider call runs with no transaction and no connection held (§3.2, FC-03).
        with tracing.span("embed"):
            (vector,) = await self._gate.call(lambda: self._provider.embed([text]))
        require_dimension(vector, self._dimension)
        with tracing.span("save embedding"):
            saved = await stage_saves.save_embedding(
                self._stage_pool,
                context_id=request.context_id,
                attempt=attempt,
                user_id=request.user_id,
                record_id=request.record_id,
                embedding=vector,
                embedding_profile=self._profile,
            )
        if saved is None:
            self._counts.discarded.inc()
            logger.info("embedding result discarded: context_id=%d", request.context_id)
            return None
        self._counts.completed.inc()
        # One INFO line per context is enough: the keyword stage's completion names it.
        logger.debug("embedding completed: context_id=%d", request.context_id)
        return Embedded(vector, saved.keyword_attempt)
