"""Claiming one stage and running it under one hard deadline: the frame of both stages (§2).

0 rows is a normal outcome (DEBUG); a reclaim of a stale ``PROCESSING`` is logged at WARNING and
counted. An error while claiming changed nothing: the stage is left as it was for the rescan.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from app.errors import PermanentError, StageDeadlineExceeded, TransientError
from app.metrics import StageMetrics
from app.repository import context_ai_state
from app.repository.stage_pool import StagePool
from app.service import stage_failure
from app.service.stage_limits import StageLimits
from pinlog_platform import tracing
from pinlog_platform.contract.states import Stage
from pinlog_platform.logging import log_context

logger = logging.getLogger(__name__)
T = TypeVar("T")


async def run_claimed(
    stage_pool: StagePool,
    stage: Stage,
    context_id: int,
    *,
    limits: StageLimits,
    work: Callable[[int], Awaitable[T]],
    counts: StageMetrics,
    attempt: int | None = None,
) -> T | None:
    """Claim ``stage`` (unless ``attempt`` says the statement before already did) and run
    ``work(attempt)``; ``work``'s result, or ``None`` when not claimed or when it failed.
    Never raises: errors are settled by the §6 rules (``stage_failure``). ``attempt`` is the
    claim's fencing token: the save and the permanent failure take effect only while no later
    claim superseded it (docs/state-machine.md).

    One deadline (``limits.deadline_seconds``, a share of ``limits.expiry_seconds``) covers
    everything from the claim to the save's commit: provider calls with the SDK's retries and
    ``Retry-After`` sleeps, judge re-asks, pool and lock waits. When it fires the stage is
    abandoned while still ours, left ``PROCESSING`` (transient) and logged, so a request that
    reclaims it after the expiry never meets a live attempt (§2, §10 #9). A save cancelled
    mid-transaction rolls back whole.

    ``counts``: this stage's metrics (outcomes, reclaims, deadlines, runs in flight, and the
    seconds of a claimed run).
    """
    deadline = limits.deadline_seconds
    scope = asyncio.timeout(deadline)
    started = time.monotonic()
    counts.in_flight.inc()
    try:
        with log_context(stage=stage.label), tracing.span(f"{stage.label} stage"):
            try:
                async with scope:
                    if attempt is None:
                        attempt = await claim_stage(
                            stage_pool,
                            stage,
                            context_id,
                            expiry_seconds=limits.expiry_seconds,
                            counts=counts,
                            abandoned_attempt=limits.abandoned.attempt_of(stage, context_id),
                        )
                    if attempt is not None:
                        limits.abandoned.forget(stage, context_id)
                    if attempt is None:
                        return None
                    return await work(attempt)
            except TimeoutError as exc:
                error: Exception = exc
                if scope.expired():
                    counts.deadlines.inc()
                    error = StageDeadlineExceeded(f"stage deadline of {deadline:g} s exceeded")
            except Exception as exc:
                error = exc
            if attempt is None:
                # The deadline fired before the claim answered: nothing of ours to settle.
                return None
            # Outside the deadline: marking FAILED must not be cut short by it.
            await stage_failure.settle(
                stage_pool, stage, context_id, error, attempt=attempt, counts=counts
            )
            if not isinstance(error, PermanentError):
                # Left PROCESSING and nothing of this attempt runs any more: the next request
                # for the context takes it over at once (app.service.abandoned_claims).
                limits.abandoned.note(
                    stage, context_id, attempt, keep_seconds=limits.expiry_seconds
                )
            return None
    finally:
        counts.in_flight.dec()
        if attempt is not None:  # a run of ours: not a claim that found the stage taken
            counts.seconds.observe(time.monotonic() - started)


async def claim_stage(
    stage_pool: StagePool,
    stage: Stage,
    context_id: int,
    *,
    expiry_seconds: float,
    counts: StageMetrics,
    abandoned_attempt: int | None = None,
) -> int | None:
    """The attempt number when this request now owns ``stage`` of ``context_id`` (started or
    reclaimed), else ``None`` (counted in ``counts``). Never raises."""
    try:
        with tracing.span(f"claim {stage.label}"):
            claim = await context_ai_state.claim(
                stage_pool,
                stage,
                context_id,
                expiry_seconds=expiry_seconds,
                abandoned_attempt=abandoned_attempt,
            )
    except TransientError as exc:
        # The message names the cause: "database lock timeout" (a row busy elsewhere) is not
        # "database unavailable" (§6).
        counts.transient.inc()
        logger.warning(
            "%s claim failed, stage unchanged: context_id=%d cause=%s reason=%s",
            stage.label,
            context_id,
            type(exc).__name__,
            exc,
        )
        return None
    except Exception as exc:
        counts.transient.inc()
        logger.error(
            "unexpected error while claiming %s: context_id=%d cause=%s",
            stage.label,
            context_id,
            type(exc).__name__,
            exc_info=exc,
        )
        return None
    if not claim.claimed:
        counts.not_claimed.inc()
        logger.debug(
            "%s not claimed: context_id=%d status=%s",
            stage.label,
            context_id,
            claim.previous_status,
        )
        return None
    note_claim(stage, context_id, reclaimed=claim.reclaimed, counts=counts)
    return claim.attempt


def note_claim(stage: Stage, context_id: int, *, reclaimed: bool, counts: StageMetrics) -> None:
    """A reclaim of a stale ``PROCESSING`` means earlier work did not finish in time (§2):
    WARNING and counted. A fresh start says nothing."""
    if reclaimed:
        counts.reclaims.inc()
        logger.warning("stale %s stage reclaimed: context_id=%d", stage.label, context_id)
