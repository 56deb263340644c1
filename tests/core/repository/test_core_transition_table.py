"""Every core statement on ``ai.context_ai_state`` from every status, checked against
``CORE_TRANSITIONS`` (§9, §0), as ``tests/worker/repository/test_transition_table.py`` does for the
worker's.

Each operation runs once over one row per combination of stage statuses, stale (past both
expiries) or fresh, with retries left or spent, so its WHERE clause sees every status. Each
row must end as the §9 rules say (the oracle below, written in the vocabulary: ``STAGE_ORDER``,
``CLAIMABLE``, ``Stage.requires``); every status change must be in the operation's table and
every entry of the table must happen. Besides: a status change sets ``updated_at`` (§0
principle 4) and the rescan claim never does (docs/rescan.md); no core statement writes an
attempt column (docs/state-machine.md "Attempts"); only counting an accepted dispatch spends a
retry, and never a context's first (docs/rescan.md "Budget").
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import datetime

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.repository import context_ai_state, keyword_reprocess
from core_service.repository.context_ai_state import Expiries
from pinlog_platform.contract.states import (
    CLAIMABLE,
    CORE_TRANSITIONS,
    STAGE_ORDER,
    CoreOperation,
    Stage,
    Status,
)
from tests.worker.support import PROFILE, make_embedding, make_state

EXPIRIES = Expiries(pending_seconds=300, processing_seconds=600)
STALE_SECONDS = 601  # past both expiries
MAX_RETRY = 3
ATTEMPT = 7  # every built row's attempt on every stage; no core statement may change it
NEW_CONTEXT_ID = 100_000  # no row: where the create inserts
# (statuses in STAGE_ORDER, stale, retry_count); row i has context_id i + 1.
CASES = [
    (statuses, stale, retry)
    for statuses in itertools.product(list(Status), repeat=len(STAGE_ORDER))
    for stale in (False, True)
    for retry in (0, MAX_RETRY)
]
CONTEXT_IDS = list(range(1, len(CASES) + 1))

READ_ROWS = text(
    "SELECT context_id, retry_count, updated_at, rescanned_at, dispatch_accepted_at, "
    "next_dispatch_at, "
    + ", ".join(f"{stage.status_column}, {stage.attempt_column}" for stage in STAGE_ORDER)
    + " FROM ai.context_ai_state"
)
SET_ATTEMPTS = text(
    "UPDATE ai.context_ai_state SET "
    + ", ".join(f"{stage.attempt_column} = :attempt" for stage in STAGE_ORDER)
)


@dataclass(frozen=True, slots=True)
class StateRow:
    statuses: dict[Stage, Status]
    attempts: dict[Stage, int]
    retry_count: int
    updated_at: datetime
    rescanned_at: datetime | None
    dispatch_accepted_at: datetime | None
    next_dispatch_at: datetime | None


async def _read(engine: AsyncEngine) -> dict[int, StateRow]:
    async with engine.connect() as conn:
        rows = (await conn.execute(READ_ROWS)).mappings().all()
    return {
        row["context_id"]: StateRow(
            statuses={stage: Status(row[stage.status_column]) for stage in STAGE_ORDER},
            attempts={stage: row[stage.attempt_column] for stage in STAGE_ORDER},
            retry_count=row["retry_count"],
            updated_at=row["updated_at"],
            rescanned_at=row["rescanned_at"],
            dispatch_accepted_at=row["dispatch_accepted_at"],
            next_dispatch_at=row["next_dispatch_at"],
        )
        for row in rows
    }


async def _build(engine: AsyncEngine) -> dict[int, StateRow]:
    for context_id, (statuses, stale, retry) in zip(CONTEXT_IDS, CASES, strict=True):
        await make_state(
            engine,
            context_id=context_id,
            retry_count=retry,
            updated_seconds_ago=STALE_SECONDS if stale else 0,
            **{
                stage.status_column: status
                for stage, status in zip(STAGE_ORDER, statuses, strict=True)
            },
        )
    async with engine.begin() as conn:
        await conn.execute(SET_ATTEMPTS, {"attempt": ATTEMPT})
    return await _read(engine)


async def _create_each(engine: AsyncEngine) -> None:
    for context_id in CONTEXT_IDS:
        with pytest.raises(IntegrityError):  # a context's state row is created once
            async with engine.begin() as conn:
                await context_ai_state.insert_pending(
                    conn, context_id=context_id, user_id=1, record_id=1, body="note"
                )
    async with engine.begin() as conn:
        await context_ai_state.insert_pending(
            conn, context_id=NEW_CONTEXT_ID, user_id=1, record_id=1, body="note"
        )


async def _operate(engine: AsyncEngine, operation: CoreOperation) -> None:
    """Run ``operation``'s repository function once over every built row."""
    if operation is CoreOperation.CREATE:
        await _create_each(engine)
        return
    if operation is CoreOperation.REPROCESS_KEYWORDS:
        for context_id in CONTEXT_IDS:  # judged under the profile, no analysis: all stale
            await make_embedding(engine, context_id=context_id, profile=PROFILE)
    batch = {"batch_size": len(CASES)}
    async with engine.begin() as conn:
        if operation is CoreOperation.CANCEL:
            await context_ai_state.cancel(conn, CONTEXT_IDS)
        elif operation is CoreOperation.FINALIZE:
            await context_ai_state.finalize_exhausted(
                conn, expiries=EXPIRIES, max_retry=MAX_RETRY, **batch
            )
        elif operation is CoreOperation.CLOSE_BLOCKED:
            await context_ai_state.close_blocked_keyword_stages(conn, **batch)
        elif operation is CoreOperation.RESCAN_CLAIM:
            await context_ai_state.claim_stale(
                conn, expiries=EXPIRIES, max_retry=MAX_RETRY, **batch
            )
        elif operation is CoreOperation.COUNT_DISPATCH:
            for _dispatch in ("first", "second"):  # the first is free, the second spends
                for context_id in CONTEXT_IDS:
                    await context_ai_state.record_accepted_dispatch(
                        conn, context_id=context_id, max_retry=MAX_RETRY
                    )
        elif operation is CoreOperation.DEFER_DISPATCH:
            await context_ai_state.defer_dispatch(conn, CONTEXT_IDS, delay_seconds=0)
        elif operation is CoreOperation.REPROCESS_KEYWORDS:
            await keyword_reprocess.reset_keyword_stages(
                conn, CONTEXT_IDS, profile=PROFILE, version=2
            )
        else:
            raise AssertionError(f"no statement drives {operation}")


def _next_stage_is_stale(statuses: dict[Stage, Status], stale: bool) -> bool:
    """The rescan's staleness (docs/rescan.md): judged by the first stage in ``STAGE_ORDER``
    that is not ``COMPLETED``, which must be unfinished; the built rows are past both
    expiries or within both."""
    for stage in STAGE_ORDER:
        if statuses[stage] is not Status.COMPLETED:
            return stale and statuses[stage] in CLAIMABLE
    return False


def _expected(
    operation: CoreOperation, statuses: dict[Stage, Status], stale: bool, retry: int
) -> tuple[dict[Stage, Status], int]:
    """Statuses and ``retry_count`` after ``operation`` on an existing row (§9)."""
    stale_work = _next_stage_is_stale(statuses, stale)
    if operation is CoreOperation.CANCEL:  # whatever they were
        return dict.fromkeys(statuses, Status.CANCELLED), retry
    if operation is CoreOperation.FINALIZE and retry >= MAX_RETRY and stale_work:
        # Unfinished stages only: COMPLETED, FAILED and CANCELLED stay (CANCELLED wins).
        failed = {s: Status.FAILED for s, status in statuses.items() if status in CLAIMABLE}
        return statuses | failed, retry
    if operation is CoreOperation.CLOSE_BLOCKED:  # a stage whose requirement FAILED for good
        blocked = {
            stage: Status.FAILED
            for stage, status in statuses.items()
            if status in CLAIMABLE and Status.FAILED in {statuses[r] for r in stage.requires}
        }
        return statuses | blocked, retry
    if operation is CoreOperation.COUNT_DISPATCH and retry < MAX_RETRY:
        return statuses, retry + 1  # the second accepted dispatch spends one, no status moved
    if operation is CoreOperation.REPROCESS_KEYWORDS and set(statuses.values()) == {
        Status.COMPLETED
    }:
        # Only a finished pipeline: the keyword stage back to PENDING, a fresh budget.
        return statuses | {Stage.KEYWORD: Status.PENDING}, 0
    return statuses, retry


def _claimed(operation: CoreOperation, statuses: dict[Stage, Status], stale: bool, retry: int):
    """Whether the rescan claim takes the row (it stamps ``rescanned_at``, spends nothing)."""
    return (
        operation is CoreOperation.RESCAN_CLAIM
        and retry < MAX_RETRY
        and _next_stage_is_stale(statuses, stale)
    )


# Operations that change no status leave the worker's progress clock alone (docs/rescan.md).
_LEAVE_UPDATED_AT = (
    CoreOperation.RESCAN_CLAIM,
    CoreOperation.COUNT_DISPATCH,
    CoreOperation.DEFER_DISPATCH,
)


def test_every_operation_has_a_table():
    assert set(CORE_TRANSITIONS) == set(CoreOperation)


@pytest.mark.parametrize("operation", list(CoreOperation))
async def test_core_operation_moves_a_stage_only_along_its_table(engine, operation):
    before = await _build(engine)
    await _operate(engine, operation)
    after = await _read(engine)

    observed: set[tuple[Status | None, Status]] = set()
    if operation is CoreOperation.CREATE:
        created = after.pop(NEW_CONTEXT_ID)
        assert (created.retry_count, created.rescanned_at) == (0, None)
        assert set(created.attempts.values()) == {0}
        observed |= {(None, status) for status in created.statuses.values()}
    assert after.keys() == before.keys()
    for context_id, (statuses, stale, retry) in zip(CONTEXT_IDS, CASES, strict=True):
        was, now = before[context_id], after[context_id]
        case = (operation, statuses, stale, retry)
        expected = _expected(operation, was.statuses, stale, retry)
        assert (now.statuses, now.retry_count) == expected, case
        assert now.attempts == was.attempts, case
        observed |= {
            (was.statuses[stage], now.statuses[stage])
            for stage in STAGE_ORDER
            if was.statuses[stage] is not now.statuses[stage]
        }
        if now.statuses != was.statuses:
            assert now.updated_at > was.updated_at, case
        if operation in _LEAVE_UPDATED_AT:
            assert now.updated_at == was.updated_at, case
        deferred = operation is CoreOperation.DEFER_DISPATCH and any(
            status in CLAIMABLE for status in was.statuses.values()
        )
        assert (now.next_dispatch_at is not None) == deferred, case
        claimed = _claimed(operation, was.statuses, stale, retry)
        assert (now.rescanned_at is not None) == claimed, case
        counted = operation is CoreOperation.COUNT_DISPATCH
        assert (now.dispatch_accepted_at is not None) == counted, case

    assert observed == CORE_TRANSITIONS[operation]
