"""What a stage does with an error, by class (§6): one place for the whole pipeline.

permanent -> ``PROCESSING -> FAILED`` (guarded; a concurrent ``CANCELLED`` wins), ERROR log;
bad input -> the same, WARNING log (the caller's text, not our fault, FC-09);
transient -> stage left ``PROCESSING`` for the rescan, WARNING log;
provider protocol fault or a bug of ours -> left ``PROCESSING``, ERROR log (FC-01).
Log lines carry the context id, the stage and the error class; never user text.
"""

from __future__ import annotations

import logging

from app.errors import (
    InvalidInputError,
    PermanentError,
    ProviderProtocolError,
    TransientError,
)
from app.metrics import StageMetrics
from app.repository import context_ai_state
from app.repository.stage_pool import StagePool
from pinlog_platform.states import Stage

logger = logging.getLogger(__name__)


async def settle(
    stage_pool: StagePool,
    stage: Stage,
    context_id: int,
    exc: Exception,
    *,
    attempt: int,
    counts: StageMetrics,
) -> None:
    """Apply the §6 rule for ``exc`` raised while ``stage`` of ``context_id`` was ours under
    claim ``attempt`` (a superseded attempt marks nothing); the outcome is counted in
    ``counts`` (``failed`` or ``transient``)."""
    if isinstance(exc, PermanentError):
        level = logging.WARNING if isinstance(exc, InvalidInputError) else logging.ERROR
        failed = await _fail(stage_pool, stage, context_id, attempt)
        counts.failed.inc()
        logger.log(
            level,
            "stage failed permanently: context_id=%d stage=%s cause=%s reason=%s marked=%s",
            context_id,
            stage.label,
            type(exc).__name__,
            exc,
            "FAILED" if failed else "unchanged",
        )
        return
    counts.transient.inc()
    if isinstance(exc, ProviderProtocolError):
        logger.error(
            "provider protocol fault, stage left PROCESSING: context_id=%d stage=%s reason=%s",
            context_id,
            stage.label,
            exc,
        )
    elif isinstance(exc, TransientError):
        logger.warning(
            "transient failure, stage left PROCESSING: context_id=%d stage=%s cause=%s reason=%s",
            context_id,
            stage.label,
            type(exc).__name__,
            exc,
        )
    else:
        logger.error(
            "unexpected error, stage left PROCESSING: context_id=%d stage=%s cause=%s",
            context_id,
            stage.label,
            type(exc).__name__,
            exc_info=exc,
        )


async def _fail(stage_pool: StagePool, stage: Stage, context_id: int, attempt: int) -> bool:
    try:
        return await context_ai_state.fail(stage_pool, stage, context_id, attempt=attempt) == 1
    except TransientError as exc:
        logger.warning(
            "could not mark FAILED, stage left PROCESSING: context_id=%d stage=%s reason=%s",
            context_id,
            stage.label,
            exc,
        )
        return False
