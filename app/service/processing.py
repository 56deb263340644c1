"""The single entry point per context (§3): pre-check, embedding stage, keyword stage.

The rescan re-enters here too; there is no rescan-only path.
"""

from __future__ import annotations

import logging

from sqlalchemy.ext.asyncio import AsyncEngine

from app import metrics
from app.repository import context_ai_state, context_text_fingerprint
from app.repository.db import autocommit
from app.service import context_text
from app.service.embedding_stage import EmbeddingStage
from app.service.keyword_stage import KeywordStage
from app.service.requests import ProcessRequest
from app.states import CLAIMABLE, Status

logger = logging.getLogger(__name__)


class ContextProcessor:
    def __init__(
        self, engine: AsyncEngine, embedding_stage: EmbeddingStage, keyword_stage: KeywordStage
    ) -> None:
        self._engine = engine
        self._embedding_stage = embedding_stage
        self._keyword_stage = keyword_stage

    async def process(self, request: ProcessRequest) -> None:
        """Advance whatever stages of ``request.context_id`` this request may claim.

        Raises ``TransientError`` only when the pre-check cannot reach the database; stage
        errors are settled inside the stages (§6).
        """
        context_id = request.context_id
        async with autocommit(self._engine) as conn:
            progress = await context_ai_state.load_progress(conn, context_id)
            if progress is None:
                logger.info("no state row, nothing to do: context_id=%d", context_id)
                return
            if progress.owner_known and not progress.is_owned_by(
                request.user_id, request.record_id
            ):
                # The core wrote the owner at create time: the source of truth. This request
                # is refused and leaves no trace, so the correct one still runs (§7, §8).
                metrics.CONTRACT_VIOLATIONS.labels("owner_mismatch").inc()
                logger.warning(
                    "contract violation: userId or recordId differs from the owner the core "
                    "side recorded, request refused: context_id=%d",
                    context_id,
                )
                return
            match = await context_text_fingerprint.record(
                conn,
                context_id=context_id,
                user_id=request.user_id,
                record_id=request.record_id,
                text_sha256=context_text.fingerprint(request.text),
            )
        if not progress.owner_known and not match.same_owner:
            # No owner from the core (a row written by the original contract's core side):
            # storing a vector under another user would leak it into that user's search (§7),
            # so the first request's owner stays the truth and this request does nothing.
            metrics.CONTRACT_VIOLATIONS.labels("owner_changed").inc()
            logger.warning(
                "contract violation: same contextId with a different userId or recordId, "
                "request ignored: context_id=%d",
                context_id,
            )
            return
        if not match.same_text:
            # A caller bug: never treated as an edit, nothing is reset (§3, scenario 5).
            metrics.CONTRACT_VIOLATIONS.labels("text_changed").inc()
            logger.warning(
                "contract violation: same contextId with a different text: context_id=%d",
                context_id,
            )
        if progress.embedding_status not in CLAIMABLE and progress.keyword_status not in CLAIMABLE:
            logger.info(
                "nothing to do: context_id=%d embedding=%s keyword=%s",
                context_id,
                progress.embedding_status,
                progress.keyword_status,
            )
            return
        vector = await self._embedding_stage.run(request, progress)
        # The keyword claim needs embedding COMPLETED: either this request just produced or
        # reused the vector, or it was COMPLETED already (resume, profile mismatch). Otherwise
        # the claim could only affect 0 rows, after waiting on the row lock for nothing.
        embedding_ready = vector is not None or progress.embedding_status is Status.COMPLETED
        if embedding_ready and progress.keyword_status in CLAIMABLE:
            await self._keyword_stage.run(request, progress, vector)
