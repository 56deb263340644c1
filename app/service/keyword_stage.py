"""The keyword stage of §3.3: claim, candidates (§4), judge outside transactions, save."""

from __future__ import annotations

import logging

import numpy as np

from app.errors import PermanentError, ProfileMismatchError
from app.metrics import WorkerMetrics
from app.providers.base import KeywordJudge
from app.repository import stage_saves
from app.repository.context_start import ContextStart
from app.repository.stage_pool import StagePool
from app.service import context_text
from app.service.judgment import map_verdict
from app.service.presets import PresetCache
from app.service.provider_gate import ProviderGate
from app.service.requests import ProcessRequest
from app.service.stage_claim import run_claimed
from app.service.stage_limits import StageLimits
from pinlog_platform import tracing
from pinlog_platform.contract.states import Stage

logger = logging.getLogger(__name__)
STAGE = Stage.KEYWORD


class KeywordStage:
    """§3.3 for one request: candidates, judge, save; claimed here or by the embedding save.

    Outcomes are counted in ``metrics`` under ``stage="keyword"``, dropped judge items by reason.
    """

    def __init__(
        self,
        stage_pool: StagePool,
        judge: KeywordJudge,
        gate: ProviderGate,
        presets: PresetCache,
        *,
        metrics: WorkerMetrics,
        limits: StageLimits,
        top_k: int,
        similarity_floor: float,
    ) -> None:
        self._stage_pool = stage_pool
        self._judge = judge
        self._gate = gate
        self._presets = presets
        self._limits = limits
        self._top_k = top_k
        self._similarity_floor = similarity_floor
        self._counts = metrics.stages[STAGE]
        self._items_dropped = metrics.judge_items_dropped

    async def run(
        self,
        request: ProcessRequest,
        start: ContextStart,
        vector: np.ndarray | None,
        attempt: int | None,
    ) -> None:
        """Judge and store keywords if this request owns or may claim the stage.

        ``vector``: float32 ``(dimension,)`` from the embedding stage, or ``None`` to use the
        one the pre-check read in ``start`` (no second read). ``attempt``: the claim the
        embedding save already made, or ``None`` to claim here. Never raises: errors are
        settled by the §6 rules.
        """
        await run_claimed(
            self._stage_pool,
            STAGE,
            request.context_id,
            limits=self._limits,
            work=lambda attempt: self._judge_and_save(request, start, vector, attempt),
            counts=self._counts,
            attempt=attempt,
        )

    async def _judge_and_save(
        self,
        request: ProcessRequest,
        start: ContextStart,
        vector: np.ndarray | None,
        attempt: int,
    ) -> None:
        snapshot = self._presets.snapshot()  # one snapshot from candidates to save (§4)
        if vector is None:
            vector = self._stored_vector(start, snapshot.profile)
        candidates = snapshot.candidates(vector, top_k=self._top_k, floor=self._similarity_floor)
        profile = self._judge.profile
        if candidates:
            text = context_text.prepare_for_embedding(
                request.text, max_chars=self._limits.max_input_chars
            )
            with tracing.span("judge", candidates=len(candidates)):
                verdict = await self._gate.call(lambda: self._judge.judge(text, candidates))
            profile = verdict.profile or profile  # the judge that answered (a fallback's)
            judgment = map_verdict(verdict, {candidate.id for candidate in candidates})
            if judgment.dropped:
                for reason, count in judgment.dropped.items():
                    self._items_dropped.labels(reason).inc(count)
                # Counts by reason only: an item may quote model output, never logged (§6).
                logger.info(
                    "judge items dropped: context_id=%d %s",
                    request.context_id,
                    " ".join(f"{k}={v}" for k, v in sorted(judgment.dropped.items())),
                )
            selections, unmatched = judgment.selections, judgment.unmatched_concepts
        else:
            selections, unmatched = (), ()  # zero candidates: COMPLETED, judge not called
        with tracing.span("save keywords", keywords=len(selections)):
            saved = await stage_saves.save_keywords(
                self._stage_pool,
                context_id=request.context_id,
                attempt=attempt,
                selections=selections,
                preset_version=snapshot.version,
                unmatched_concepts=unmatched,
                model_profile=profile,
                embedding_profile=snapshot.profile,
                candidates=[(candidate.id, candidate.similarity) for candidate in candidates],
            )
        if not saved:
            self._counts.discarded.inc()
            logger.info("keyword result discarded: context_id=%d", request.context_id)
            return
        self._counts.completed.inc()
        logger.info(
            "keyword completed: context_id=%d keywords=%d candidates=%d",
            request.context_id,
            len(selections),
            len(candidates),
        )

    @staticmethod
    def _stored_vector(start: ContextStart, profile: str) -> np.ndarray:
        """The vector the pre-check read; it must use the presets' profile (§5)."""
        if start.embedding is None:
            raise PermanentError("completed embedding has no stored vector")
        if start.embedding_profile != profile:
            raise ProfileMismatchError(
                f"context embedding profile {start.embedding_profile!r} differs from "
                f"preset profile {profile!r}"
            )
        return start.embedding
