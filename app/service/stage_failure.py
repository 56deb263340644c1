"""What a stage does with an error, by class (§6 with its deviation): one place for the
whole pipeline.

permanent -> ``PROCESSING -> FAILED`` with its ``FailureReason`` in the same statement
(guarded; a concurrent ``CANCELLED`` wins), ERROR log, ``pinlog_stage_failures_total``;
bad input -> the same, WARNING log (the caller's text, not our fault, FC-09);
provider-wide fault (key, quota, model, parameter, endpoint, protocol) -> left ``PROCESSING``,
one ERROR line naming provider, status, ``error.code``, ``error.type``, ``error.param``;
provider unavailable (its gate is open: no call made) -> left ``PROCESSING``, WARNING;
transient -> left ``PROCESSING`` for the rescan, WARNING;
a bug of ours -> left ``PROCESSING``, ERROR with traceback (FC-01).
Log lines carry the context id, the stage and the error class; never user text, the prompt or
a provider's message.
"""

from __future__ import annotations

import logging

from app.errors import (
    InvalidInputError,
    PermanentError,
    ProviderGateClosed,
    ProviderProtocolError,
    ProviderUnavailableError,
    TransientError,
)
from app.metrics import StageMetrics
from app.repository import context_ai_state
from app.repository.stage_pool import StagePool
from pinlog_platform.contract.states import Stage
from pinlog_platform.contract.states.failure_reasons import FailureReason

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
    """Apply the rule for ``exc`` raised while ``stage`` of ``context_id`` was ours under
    claim ``attempt`` (a superseded attempt marks nothing); the outcome is counted in
    ``counts`` (``failed`` with its reason, or ``transient``)."""
    if isinstance(exc, PermanentError):
        level = logging.WARNING if isinstance(exc, InvalidInputError) else logging.ERROR
        failed = await _fail(stage_pool, stage, context_id, attempt, exc.reason)
        counts.failed.inc()
        if failed:
            counts.failure_reasons[exc.reason].inc()
        logger.log(
            level,
            "stage failed permanently: context_id=%d stage=%s cause=%s reason=%s code=%s marked=%s",
            context_id,
            stage.label,
            type(exc).__name__,
            exc,
            exc.reason,
            "FAILED" if failed else "unchanged",
        )
        return
    counts.transient.inc()
    if isinstance(exc, ProviderUnavailableError):
        logger.error(
            "%s, stage left PROCESSING: context_id=%d stage=%s provider=%s "
            "status=%s code=%s type=%s param=%s reason=%s",
            "provider protocol fault"
            if isinstance(exc, ProviderProtocolError)
            else "provider-wide fault",
            context_id,
            stage.label,
            exc.layer,
            exc.status,
            exc.code,
            exc.error_type,
            exc.param,
            exc.reason,
        )
    elif isinstance(exc, ProviderGateClosed):
        logger.warning(
            "provider unavailable, stage left PROCESSING: context_id=%d stage=%s reason=%s",
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


async def _fail(
    stage_pool: StagePool, stage: Stage, context_id: int, attempt: int, reason: FailureReason
) -> bool:
    try:
        affected = await context_ai_state.fail(
            stage_pool, stage, context_id, attempt=attempt, reason=reason
        )
    except TransientError as exc:
        logger.warning(
            "could not mark FAILED, stage left PROCESSING: context_id=%d stage=%s reason=%s",
            context_id,
            stage.label,
            exc,
        )
        return False
    return affected == 1
