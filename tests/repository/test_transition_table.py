"""Every worker statement from every status, checked against ``WORKER_TRANSITIONS`` (§2)."""

from __future__ import annotations

import itertools

import pytest
from sqlalchemy import text

from app.repository import context_ai_state
from app.states import WORKER_TRANSITIONS, Stage, Status
from tests.builders import fetch_state, make_state

EXPIRY = 600
# What each statement may do, by the §2 table; together they cover all of it.
EXPECTED = {
    "claim": {(Status.PENDING, Status.PROCESSING), (Status.PROCESSING, Status.PROCESSING)},
    "complete": {(Status.PROCESSING, Status.COMPLETED)},
    "fail": {(Status.PROCESSING, Status.FAILED)},
}
DELETE_STATE = text("DELETE FROM ai.context_ai_state WHERE context_id = 1")


async def _apply(engine, statement: str, stage: Stage, attempt: int = 0) -> int:
    """Run one statement; ``attempt`` is the fencing token complete/fail present (rows made
    by the builder were never claimed: attempt 0)."""
    async with engine.begin() as conn:
        if statement == "claim":
            outcome = await context_ai_state.claim(conn, stage, 1, expiry_seconds=EXPIRY)
            return outcome.affected
        if statement == "complete":
            return await context_ai_state.complete(conn, stage, 1, attempt=attempt)
        return await context_ai_state.fail(conn, stage, 1, attempt=attempt)


def test_the_statements_together_cover_exactly_the_table():
    assert set().union(*EXPECTED.values()) == WORKER_TRANSITIONS


@pytest.mark.parametrize("stage", list(Stage))
@pytest.mark.parametrize("statement", list(EXPECTED))
async def test_statement_moves_a_stage_only_along_the_transition_table(engine, stage, statement):
    column = 0 if stage is Stage.EMBEDDING else 1
    observed: set[tuple[Status, Status]] = set()
    for before, stale in itertools.product(list(Status), [False, True]):
        await make_state(
            engine,
            context_id=1,
            # The keyword stage may only move while the embedding is COMPLETED (§2).
            embedding_status=before if stage is Stage.EMBEDDING else "COMPLETED",
            keyword_status=before if stage is Stage.KEYWORD else "PENDING",
            updated_seconds_ago=EXPIRY * 2 if stale else 0,
        )
        affected = await _apply(engine, statement, stage)
        after = Status((await fetch_state(engine, 1))[column])
        if affected:
            observed.add((before, after))
        else:
            assert after is before, (statement, before, stale)
        async with engine.begin() as conn:
            await conn.execute(DELETE_STATE)

    assert observed == EXPECTED[statement]


@pytest.mark.parametrize("stage", list(Stage))
@pytest.mark.parametrize("statement", ["complete", "fail"])
async def test_a_superseded_attempt_moves_nothing_from_any_status(engine, stage, statement):
    """The fencing token (docs/state-machine.md "Attempts"): complete and fail name the
    attempt they belong to; any other attempt number changes no row."""
    column = 0 if stage is Stage.EMBEDDING else 1
    for before in Status:
        await make_state(
            engine,
            context_id=1,
            embedding_status=before if stage is Stage.EMBEDDING else "COMPLETED",
            keyword_status=before if stage is Stage.KEYWORD else "PENDING",
        )
        assert await _apply(engine, statement, stage, attempt=1) == 0
        assert Status((await fetch_state(engine, 1))[column]) is before
        async with engine.begin() as conn:
            await conn.execute(DELETE_STATE)


@pytest.mark.parametrize("stage", list(Stage))
async def test_every_claim_takes_the_next_attempt(engine, stage):
    await make_state(
        engine,
        context_id=1,
        embedding_status="PENDING" if stage is Stage.EMBEDDING else "COMPLETED",
    )
    claims = []
    # A reclaim (expiry 0: any earlier claim is stale) takes the next number; a duplicate
    # within the expiry takes none.
    for expiry in (EXPIRY, 0, EXPIRY):
        async with engine.begin() as conn:
            claims.append(await context_ai_state.claim(conn, stage, 1, expiry_seconds=expiry))
    first, second, duplicate = claims
    assert (first.attempt, second.attempt) == (1, 2)
    assert (duplicate.claimed, duplicate.attempt) == (False, None)
