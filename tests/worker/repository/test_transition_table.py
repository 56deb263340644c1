"""Every worker statement from every status, checked against ``WORKER_TRANSITIONS`` (§2).

The statements: the stand-alone claim, the start of a context (its embedding claim), the two
saves (their ``COMPLETED``; the embedding save also starts a ``PENDING`` keyword stage) and the
fail. A move of either column must be in the table; rows made by the builder were never
claimed, so their live attempt is 0. The other stages of a row are what the stage under test
requires (``Stage.requires``), else ``PENDING``.
"""

from __future__ import annotations

import hashlib
import itertools

import pytest
from sqlalchemy import text

from app.repository import context_ai_state, context_start, stage_saves
from pinlog_platform.contract.states import (
    CLAIMABLE,
    STAGE_ORDER,
    WORKER_TRANSITIONS,
    Stage,
    Status,
)
from tests.worker.support import PROFILE, fetch_state, make_preset, make_state, vector

EXPIRY = 600
CLAIMS = {(Status.PENDING, Status.PROCESSING), (Status.PROCESSING, Status.PROCESSING)}
# What each statement may do to the stage it is about, by the §2 table.
EXPECTED = {
    "claim": CLAIMS,
    "start": CLAIMS,
    "save": {(Status.PROCESSING, Status.COMPLETED)},
    "fail": {(Status.PROCESSING, Status.FAILED)},
}
APPLIES = {"start": [Stage.EMBEDDING]}
CASES = [(s, stage) for s in EXPECTED for stage in APPLIES.get(s, list(Stage))]
DELETE_STATE = text("DELETE FROM ai.context_ai_state WHERE context_id = 1")


def _statuses(stage: Stage, status: Status) -> dict[str, Status]:
    """``make_state`` arguments: ``stage`` at ``status``, every other stage at what ``stage``
    requires (§2: the keyword stage may only move while the embedding is COMPLETED)."""
    return {
        other.status_column: status if other is stage else stage.requires.get(other, Status.PENDING)
        for other in STAGE_ORDER
    }


async def _apply(stage_pool, statement: str, stage: Stage, attempt: int = 0) -> int:
    """Run one statement on context 1; rows it changed (0 or 1)."""
    if True:
        if statement == "claim":
            outcome = await context_ai_state.claim(stage_pool, stage, 1, expiry_seconds=EXPIRY)
            return outcome.affected
        if statement == "start":
            started = await context_start.start(
                stage_pool,
                context_id=1,
                user_id=1,
                record_id=1,
                text_sha256=hashlib.sha256(b"note").digest(),
                expiry_seconds=EXPIRY,
                embedding_profile=PROFILE,
            )
            return int(started is not None and started.embedding_attempt is not None)
        if statement == "save" and stage is Stage.EMBEDDING:
            saved = await stage_saves.save_embedding(
                stage_pool,
                context_id=1,
                attempt=attempt,
                user_id=1,
                record_id=1,
                embedding=vector(1),
                embedding_profile=PROFILE,
            )
            return int(saved is not None)
        if statement == "save":
            return int(
                await stage_saves.save_keywords(
                    stage_pool,
                    context_id=1,
                    attempt=attempt,
                    selections=[(1, 0.5)],
                    preset_version=1,
                    unmatched_concepts=[],
                    model_profile="judge",
                    embedding_profile=PROFILE,
                )
            )
        return await context_ai_state.fail(stage_pool, stage, 1, attempt=attempt)


def test_the_statements_together_cover_exactly_the_table():
    assert set().union(*EXPECTED.values()) == WORKER_TRANSITIONS


@pytest.mark.parametrize(("statement", "stage"), CASES)
async def test_statement_moves_a_stage_only_along_the_transition_table(
    engine, stage, statement, stage_pool
):
    await make_preset(engine, preset_id=1)
    column = 0 if stage is Stage.EMBEDDING else 1
    observed: set[tuple[Status, Status]] = set()
    for before, stale in itertools.product(list(Status), [False, True]):
        await make_state(
            engine,
            context_id=1,
            updated_seconds_ago=EXPIRY * 2 if stale else 0,
            **_statuses(stage, before),
        )
        before_both = tuple(Status(s) for s in await fetch_state(engine, 1))
        affected = await _apply(stage_pool, statement, stage)
        after_both = tuple(Status(s) for s in await fetch_state(engine, 1))
        if affected:
            observed.add((before_both[column], after_both[column]))
        else:
            assert after_both == before_both, (statement, before, stale)
        for was, now in zip(before_both, after_both, strict=True):
            assert was == now or (was, now) in WORKER_TRANSITIONS, (statement, was, now)
        async with engine.begin() as conn:
            await conn.execute(DELETE_STATE)

    assert observed == EXPECTED[statement]


@pytest.mark.parametrize(("statement", "stage"), [c for c in CASES if c[0] in ("save", "fail")])
async def test_a_superseded_attempt_moves_nothing_from_any_status(
    engine, stage, statement, stage_pool
):
    """The fencing token (docs/state-machine.md "Attempts"): the saves and fail name the
    attempt they belong to; any other attempt number changes no row."""
    await make_preset(engine, preset_id=1)
    for before in Status:
        await make_state(engine, context_id=1, **_statuses(stage, before))
        assert await _apply(stage_pool, statement, stage, attempt=1) == 0
        assert await fetch_state(engine, 1) == tuple(_statuses(stage, before).values())
        async with engine.begin() as conn:
            await conn.execute(DELETE_STATE)


@pytest.mark.parametrize("stage", list(Stage))
async def test_every_claim_takes_the_next_attempt(engine, stage, stage_pool):
    await make_state(engine, context_id=1, **_statuses(stage, Status.PENDING))
    claims = []
    # A reclaim (expiry 0: any earlier claim is stale) takes the next number; a duplicate
    # within the expiry takes none.
    for expiry in (EXPIRY, 0, EXPIRY):
        claims.append(await context_ai_state.claim(stage_pool, stage, 1, expiry_seconds=expiry))
    first, second, duplicate = claims
    assert (first.attempt, second.attempt) == (1, 2)
    assert (duplicate.claimed, duplicate.attempt) == (False, None)


@pytest.mark.parametrize("stage", [stage for stage in Stage if stage.requires])
async def test_a_stage_whose_requirement_is_unmet_is_never_claimed(engine, stage, stage_pool):
    """§2 "Start": the keyword claim adds ``AND embedding_status = 'COMPLETED'``; from any
    other status of a required stage, a claimable stage, fresh or stale, stays as it is."""
    for (required, needed), other, before, stale in itertools.product(
        stage.requires.items(), list(Status), sorted(CLAIMABLE), [False, True]
    ):
        if other is needed:
            continue
        statuses = _statuses(stage, before) | {required.status_column: other}
        await make_state(
            engine, context_id=1, updated_seconds_ago=EXPIRY * 2 if stale else 0, **statuses
        )
        outcome = await context_ai_state.claim(stage_pool, stage, 1, expiry_seconds=EXPIRY)
        assert not outcome.claimed, (stage, required, other, before, stale)
        assert await fetch_state(engine, 1) == tuple(statuses.values())
        async with engine.begin() as conn:
            await conn.execute(DELETE_STATE)
