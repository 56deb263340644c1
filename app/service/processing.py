"""The single entry point per context (§3): pre-check, embedding stage, keyword stage.

The rescan re-enters here too; there is no rescan-only path.
"""

from __future__ import annotations

import logging

from app.errors import TransientError
from app.metrics import WorkerMetrics
from app.repository import context_start
from app.repository.context_start import ContextStart
from app.repository.stage_pool import StagePool
from app.service import context_text
from app.service.embedding_stage import EmbeddingStage
from app.service.keyword_stage import KeywordStage
from app.service.requests import ProcessRequest
from app.service.stage_claim import note_claim
from app.service.stage_limits import StageLimits
from pinlog_platform import tracing
from pinlog_platform.contract.states import CLAIMABLE, Stage, Status

logger = logging.getLogger(__name__)


class ContextProcessor:
    """Runs §3 for one request at a time per worker task; holds no per-context state.

    ``metrics``: contract violations by kind, and embedding claims made by the start.
    """

    def __init__(
        self,
        stage_pool: StagePool,
        embedding_stage: EmbeddingStage,
        keyword_stage: KeywordStage,
        *,
        limits: StageLimits,
        metrics: WorkerMetrics,
    ) -> None:
        self._stage_pool = stage_pool
        self._embedding_stage = embedding_stage
        self._keyword_stage = keyword_stage
        self._limits = limits
        self._embedding_counts = metrics.stages[Stage.EMBEDDING]
        self._violations = metrics.violations

    async def process(self, request: ProcessRequest) -> None:
        """Advance whatever stages of ``request.context_id`` this request may claim.

        Never raises for a database or provider fault: a start that cannot reach the database
        changed nothing (WARNING, the rescan re-requests it); stage errors are settled inside
        the stages (§6).
        """
        start = await self._start(request)
        if start is None or not self._acceptable(request, start):
            return
        if not start.anything_to_do:
            logger.info(
                "nothing to do: context_id=%d embedding=%s keyword=%s",
                request.context_id,
                start.embedding_status,
                start.keyword_status,
            )
            return
        if (
            start.embedding_status is Status.COMPLETED
            and start.vector_coming
            and (start.embedding_profile != self._embedding_stage.profile)
        ):
            # Embedded under another profile and a switch's backfill is making this profile's
            # vector: a mismatch now would fail a note for a fault not its own. Nothing is
            # claimed; the rescan asks again once the vector is there (docs/operations.md
            # "Switching the embedding profile").
            logger.info("vector of this profile still coming: context_id=%d", request.context_id)
            return
        embedded = await self._embedding_stage.run(request, start)
        if embedded is not None and embedded.keyword_attempt is not None:
            # The embedding save also started the keyword stage (§2, one statement).
            await self._keyword_stage.run(request, start, embedded.vector, embedded.keyword_attempt)
            return
        # Otherwise the keyword claim needs embedding COMPLETED: this request produced or
        # reused the vector, or it was COMPLETED already (resume, profile mismatch). Else the
        # claim could only affect 0 rows, after waiting on the row lock for nothing.
        embedding_ready = embedded is not None or start.embedding_status is Status.COMPLETED
        if embedding_ready and start.keyword_status in CLAIMABLE:
            vector = None if embedded is None else embedded.vector
            await self._keyword_stage.run(request, start, vector, None)

    async def _start(self, request: ProcessRequest) -> ContextStart | None:
        """Pre-check, owner and text checks and the embedding claim: one statement (§3.1)."""
        try:
            with tracing.span("start and claim embedding"):
                start = await context_start.start(
                    self._stage_pool,
                    context_id=request.context_id,
                    user_id=request.user_id,
                    record_id=request.record_id,
                    text_sha256=context_text.fingerprint(request.text),
                    expiry_seconds=self._limits.expiry_seconds,
                    embedding_profile=self._embedding_stage.profile,
                    abandoned_attempt=self._limits.abandoned.attempt_of(
                        Stage.EMBEDDING, request.context_id
                    ),
                )
        except TransientError as exc:
            # The message names the cause: "database lock timeout" (a row busy elsewhere) is
            # not "database unavailable" (§6). Nothing changed; the rescan re-requests it.
            logger.warning(
                "context start failed, nothing changed: context_id=%d cause=%s reason=%s",
                request.context_id,
                type(exc).__name__,
                exc,
            )
            return None
        if start is None:
            logger.info("no state row, nothing to do: context_id=%d", request.context_id)
        elif start.embedding_attempt is not None:
            self._limits.abandoned.forget(Stage.EMBEDDING, request.context_id)
            note_claim(
                Stage.EMBEDDING,
                request.context_id,
                reclaimed=start.embedding_reclaimed,
                counts=self._embedding_counts,
            )
        return start

    def _acceptable(self, request: ProcessRequest, start: ContextStart) -> bool:
        """Contract checks on the caller (§3): owner refused; a text other than the core's
        refused; a text change against the first request's only reported."""
        context_id = request.context_id
        if not start.same_owner:
            if start.owner_from_core:
                # The core wrote the owner at create time: the source of truth. This request
                # is refused and leaves no trace, so the correct one still runs (§7, §8).
                self._violations["owner_mismatch"].inc()
                logger.warning(
                    "contract violation: userId or recordId differs from the owner the core "
                    "side recorded, request refused: context_id=%d",
                    context_id,
                )
            else:
                # No owner from the core (the original contract): the first request's owner
                # stays the truth, so a vector is never stored under another user (§7).
                self._violations["owner_changed"].inc()
                logger.warning(
                    "contract violation: same contextId with a different userId or recordId, "
                    "request ignored: context_id=%d",
                    context_id,
                )
            return False
        if not start.same_text and start.text_from_core:
            # The core committed another text for this context: the request is refused and
            # claimed nothing, so the genuine one still runs (§3 scenario 5, Deviation).
            self._violations["text_mismatch"].inc()
            logger.warning(
                "contract violation: text differs from the one the core side committed, "
                "request refused: context_id=%d",
                context_id,
            )
            return False
        if not start.same_text:
            # A caller bug: never treated as an edit, nothing is reset (§3, scenario 5).
            self._violations["text_changed"].inc()
            logger.warning(
                "contract violation: same contextId with a different text: context_id=%d",
                context_id,
            )
        return True
