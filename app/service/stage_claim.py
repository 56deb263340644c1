"""Claiming one stage for a request: the shared front half of both stages (§2).

0 rows is a normal outcome (DEBUG); a reclaim of a stale ``PROCESSING`` is logged at WARNING and
counted. An error while claiming changed nothing: the stage is left as it was for the rescan.
"""

from __future__ import annotations

import logging

from sqlalchemy.ext.asyncio import AsyncEngine

from app import metrics
from app.errors import TransientError
from app.repository import context_ai_state
from app.repository.db import autocommit
from app.states import Stage

logger = logging.getLogger(__name__)


async def claim_stage(
    engine: AsyncEngine, stage: Stage, context_id: int, *, expiry_seconds: float
) -> bool:
    """True when this request now owns ``stage`` of ``context_id`` (started or reclaimed)."""
    try:
        async with autocommit(engine) as conn:
            claim = await context_ai_state.claim(
                conn, stage, context_id, expiry_seconds=expiry_seconds
            )
    except TransientError as exc:
        # The message names the cause: "database lock timeout" (a row busy elsewhere) is not
        # "database unavailable" (§6, issue 7 item 9).
        metrics.STAGE_OUTCOMES.labels(stage.label, "transient").inc()
        logger.warning(
            "%s claim failed, stage unchanged: context_id=%d cause=%s reason=%s",
            stage.label,
            context_id,
            type(exc).__name__,
            exc,
        )
        return False
    except Exception as exc:
        metrics.STAGE_OUTCOMES.labels(stage.label, "transient").inc()
        logger.error(
            "unexpected error while claiming %s: context_id=%d cause=%s",
            stage.label,
            context_id,
            type(exc).__name__,
            exc_info=exc,
        )
        return False
    if not claim.claimed:
        metrics.STAGE_OUTCOMES.labels(stage.label, "not_claimed").inc()
        logger.debug(
            "%s not claimed: context_id=%d status=%s",
            stage.label,
            context_id,
            claim.previous_status,
        )
        return False
    if claim.reclaimed:
        metrics.RECLAIMS.labels(stage.label).inc()
        logger.warning("stale %s stage reclaimed: context_id=%d", stage.label, context_id)
    return True
