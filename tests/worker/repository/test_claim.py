"""Claims, completes and fails on the real database (CONTRACT §2)."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from app.repository import context_ai_state
from app.repository.db import register_vector_codec
from app.repository.named_statements import compile_named
from app.repository.stage_pool import StagePool
from pinlog_platform.contract.states import Stage, Status
from tests.worker.support import fetch_state, make_state

EXPIRY = 600
SLEEP = compile_named("SELECT pg_sleep(0.05)")
SHOW_TIMEZONE = compile_named("SHOW timezone")


async def _open_connections(stage_pool: StagePool, count: int) -> None:
    """Open ``count`` pool connections first, so the race is between statements, not connects."""
    await asyncio.gather(*(stage_pool.fetch_row(SLEEP) for _ in range(count)))


async def claim(stage_pool, stage: Stage, context_id: int) -> context_ai_state.ClaimOutcome:
    return await context_ai_state.claim(stage_pool, stage, context_id, expiry_seconds=EXPIRY)


async def test_pending_embedding_is_claimed_as_fresh_start(engine, stage_pool):
    await make_state(engine, context_id=1)

    outcome = await claim(stage_pool, Stage.EMBEDDING, 1)

    assert outcome.claimed and not outcome.reclaimed
    assert outcome.previous_status is Status.PENDING
    assert await fetch_state(engine, 1) == ("PROCESSING", "PENDING")


async def test_claim_moves_updated_at_forward(engine, stage_pool):
    await make_state(engine, context_id=1, updated_seconds_ago=300)
    await claim(stage_pool, Stage.EMBEDDING, 1)
    async with engine.connect() as conn:
        age = (
            await conn.execute(
                text("SELECT extract(epoch FROM now() - updated_at) FROM ai.context_ai_state")
            )
        ).scalar_one()
    assert age < 5


async def test_claim_without_state_row_affects_nothing(engine, stage_pool):
    outcome = await claim(stage_pool, Stage.EMBEDDING, 404)
    assert outcome == context_ai_state.ClaimOutcome(affected=0, previous_status=None)


@pytest.mark.parametrize("stage", list(Stage))
async def test_cancelled_blocks_claim(engine, stage, stage_pool):
    await make_state(engine, context_id=1, embedding_status="CANCELLED", keyword_status="CANCELLED")
    outcome = await claim(stage_pool, stage, 1)
    assert not outcome.claimed
    assert outcome.previous_status is Status.CANCELLED
    assert await fetch_state(engine, 1) == ("CANCELLED", "CANCELLED")


@pytest.mark.parametrize("stage", list(Stage))
async def test_cancelled_blocks_fail(engine, stage, stage_pool):
    await make_state(engine, context_id=1, embedding_status="CANCELLED", keyword_status="CANCELLED")
    assert await context_ai_state.fail(stage_pool, stage, 1, attempt=0) == 0
    assert await fetch_state(engine, 1) == ("CANCELLED", "CANCELLED")


@pytest.mark.parametrize("final", ["FAILED", "COMPLETED"])
@pytest.mark.parametrize("stale", [False, True])
async def test_final_embedding_status_never_restarts(engine, final, stale, stage_pool):
    await make_state(
        engine, context_id=1, embedding_status=final, updated_seconds_ago=3600 if stale else 0
    )
    assert not (await claim(stage_pool, Stage.EMBEDDING, 1)).claimed
    assert (await fetch_state(engine, 1))[0] == final


@pytest.mark.parametrize("final", ["FAILED", "COMPLETED"])
async def test_final_keyword_status_never_restarts(engine, final, stage_pool):
    await make_state(
        engine,
        context_id=1,
        embedding_status="COMPLETED",
        keyword_status=final,
        updated_seconds_ago=3600,
    )
    assert not (await claim(stage_pool, Stage.KEYWORD, 1)).claimed
    assert await fetch_state(engine, 1) == ("COMPLETED", final)


@pytest.mark.parametrize("stage", list(Stage))
async def test_stale_processing_is_reclaimed_and_reported(engine, stage, stage_pool):
    await make_state(
        engine,
        context_id=1,
        embedding_status="PROCESSING" if stage is Stage.EMBEDDING else "COMPLETED",
        keyword_status="PROCESSING",
        updated_seconds_ago=EXPIRY + 60,
    )
    outcome = await claim(stage_pool, stage, 1)
    assert outcome.claimed and outcome.reclaimed
    assert outcome.previous_status is Status.PROCESSING


@pytest.mark.parametrize("stage", list(Stage))
async def test_fresh_processing_is_not_claimed(engine, stage, stage_pool):
    await make_state(
        engine,
        context_id=1,
        embedding_status="PROCESSING" if stage is Stage.EMBEDDING else "COMPLETED",
        keyword_status="PROCESSING",
        updated_seconds_ago=EXPIRY - 60,
    )
    outcome = await claim(stage_pool, stage, 1)
    assert outcome.affected == 0
    assert outcome.previous_status is Status.PROCESSING


@pytest.mark.parametrize("embedding_status", ["PENDING", "PROCESSING", "FAILED", "CANCELLED"])
async def test_keyword_claim_requires_completed_embedding(engine, embedding_status, stage_pool):
    await make_state(engine, context_id=1, embedding_status=embedding_status)
    assert not (await claim(stage_pool, Stage.KEYWORD, 1)).claimed
    assert (await fetch_state(engine, 1))[1] == "PENDING"


async def test_keyword_claim_after_completed_embedding(engine, stage_pool):
    await make_state(engine, context_id=1, embedding_status="COMPLETED")
    assert (await claim(stage_pool, Stage.KEYWORD, 1)).claimed
    assert await fetch_state(engine, 1) == ("COMPLETED", "PROCESSING")


@pytest.mark.parametrize("time_zone", ["UTC", "Asia/Seoul"])
async def test_fc06_stale_and_fresh_decisions_hold_in_every_session_time_zone(
    engine, migrated_database, time_zone
):
    await make_state(engine, context_id=1, embedding_status="PROCESSING", updated_seconds_ago=60)
    await make_state(engine, context_id=2, embedding_status="PROCESSING", updated_seconds_ago=660)
    # A stage pool whose sessions run in ``time_zone``.
    pool = await asyncpg.create_pool(
        make_url(migrated_database).set(drivername="postgresql").render_as_string(False),
        min_size=1,
        max_size=1,
        init=register_vector_codec,
        server_settings={"timezone": time_zone},
    )
    zoned = StagePool(pool, transaction_pooling=False)
    try:
        assert await zoned.fetch_row(SHOW_TIMEZONE) == (time_zone,)
        fresh = await context_ai_state.claim(zoned, Stage.EMBEDDING, 1, expiry_seconds=EXPIRY)
        stale = await context_ai_state.claim(zoned, Stage.EMBEDDING, 2, expiry_seconds=EXPIRY)
    finally:
        await zoned.close()
    assert not fresh.claimed
    assert stale.reclaimed


@pytest.mark.parametrize("stage", list(Stage))
async def test_twenty_concurrent_claims_of_one_stage_exactly_one_wins(engine, stage, stage_pool):
    await make_state(
        engine,
        context_id=1,
        embedding_status="PENDING" if stage is Stage.EMBEDDING else "COMPLETED",
    )
    ready = asyncio.Barrier(20)

    async def contender() -> context_ai_state.ClaimOutcome:
        await ready.wait()
        return await context_ai_state.claim(stage_pool, stage, 1, expiry_seconds=EXPIRY)

    await _open_connections(stage_pool, 20)

    outcomes = await asyncio.gather(*(contender() for _ in range(20)))

    assert sum(outcome.affected for outcome in outcomes) == 1
    winners = [outcome for outcome in outcomes if outcome.claimed]
    assert winners[0].previous_status is Status.PENDING
    losers = [outcome for outcome in outcomes if not outcome.claimed]
    assert {outcome.previous_status for outcome in losers} == {Status.PROCESSING}


async def test_twenty_concurrent_reclaims_of_a_stale_stage_exactly_one_wins(engine, stage_pool):
    await make_state(
        engine, context_id=1, embedding_status="PROCESSING", updated_seconds_ago=EXPIRY * 2
    )
    ready = asyncio.Barrier(20)

    async def contender() -> context_ai_state.ClaimOutcome:
        await ready.wait()
        return await context_ai_state.claim(stage_pool, Stage.EMBEDDING, 1, expiry_seconds=EXPIRY)

    await _open_connections(stage_pool, 20)

    outcomes = await asyncio.gather(*(contender() for _ in range(20)))
    assert [outcome.reclaimed for outcome in outcomes].count(True) == 1
    assert sum(outcome.affected for outcome in outcomes) == 1


@pytest.mark.parametrize("stage", list(Stage))
async def test_fail_moves_processing_to_failed_only(engine, stage, stage_pool):
    await make_state(
        engine,
        context_id=1,
        embedding_status="PROCESSING" if stage is Stage.EMBEDDING else "COMPLETED",
        keyword_status="PROCESSING",
    )
    assert await context_ai_state.fail(stage_pool, stage, 1, attempt=0) == 1
    assert await context_ai_state.fail(stage_pool, stage, 1, attempt=0) == 0
    state = await fetch_state(engine, 1)
    assert state[0 if stage is Stage.EMBEDDING else 1] == "FAILED"


@pytest.mark.parametrize("bad_stage", ["embedding_status", "keyword_status; DROP TABLE x", None])
async def test_repository_accepts_only_stage_enum(engine, bad_stage, stage_pool):
    with pytest.raises(TypeError, match="must be a Stage"):
        await context_ai_state.claim(stage_pool, bad_stage, 1, expiry_seconds=EXPIRY)
    with pytest.raises(TypeError, match="must be a Stage"):
        await context_ai_state.fail(stage_pool, bad_stage, 1, attempt=0)


@pytest.mark.parametrize("stage", list(Stage))
async def test_a_fresh_processing_stage_is_taken_over_only_at_the_attempt_given_up(
    engine, stage_pool, stage
):
    """``abandoned_attempt`` (app.service.abandoned_claims): a PROCESSING stage not yet stale is
    taken over at once while it is still at the attempt this process gave up; once another
    claim moved it on, that attempt takes nothing over (the fencing token)."""
    embedding = "PENDING" if stage is Stage.EMBEDDING else "COMPLETED"
    for context_id in (1, 2):
        await make_state(engine, context_id=context_id, embedding_status=embedding)
        first = await claim(stage_pool, stage, context_id)
        assert first.attempt == 1
    # Context 2 was reclaimed elsewhere meanwhile (attempt 2): attempt 1 is no longer its own.
    taken = await context_ai_state.claim(
        stage_pool, stage, 2, expiry_seconds=0, abandoned_attempt=None
    )
    assert taken.attempt == 2

    mine = await context_ai_state.claim(
        stage_pool, stage, 1, expiry_seconds=EXPIRY, abandoned_attempt=1
    )
    theirs = await context_ai_state.claim(
        stage_pool, stage, 2, expiry_seconds=EXPIRY, abandoned_attempt=1
    )

    assert (mine.claimed, mine.reclaimed, mine.attempt) == (True, True, 2)
    assert not theirs.claimed
