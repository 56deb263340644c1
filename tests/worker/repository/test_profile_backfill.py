"""The re-embedding backfill's own row (``ai.context_embedding_backfill``, 0060) against real
concurrent transactions: the claim (PENDING or stale, ``attempt + 1``, ``SKIP LOCKED``), the
save that locks the live state row first and loses to a cancellation, and the settle back to
``PENDING`` or ``FAILED``, each only while its attempt owns the row
(``app.repository.profile_vectors``; docs/operations.md "Switching the embedding profile").
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import asyncpg
import numpy as np
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from app.repository import profile_vectors
from app.repository.db import to_array
from app.repository.profile_vectors import CLAIM_BACKFILL, BackfillClaim
from app.repository.stage_pool import StagePool
from pinlog_platform.db.named_statements import compile_named
from tests.worker.support import PROFILE, make_embedding, make_state, vector

OTHER_PROFILE = "old-profile-1536-cosine-v1"
EXPIRY = 600
# A short expiry for reclaims: rows backdated by STALE_SECONDS are past it, fresh ones are not.
SHORT_EXPIRY = 5
STALE_SECONDS = 60
SLEEP = compile_named("SELECT pg_sleep(0.05)")
LOCK_WAITERS = text(
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
)


@pytest.fixture
async def other_session(migrated_database: str) -> AsyncIterator[asyncpg.Connection]:
    """A separate plain asyncpg connection: another worker's claim in a transaction of its
    own, held open as long as the test wants."""
    dsn = make_url(migrated_database).set(drivername="postgresql").render_as_string(False)
    conn = await asyncpg.connect(dsn)
    yield conn
    await conn.close()


# --------------------------------------------------------------------------- builders


async def make_backfill(
    engine,
    *,
    context_id: int,
    profile: str = PROFILE,
    status: str = "PENDING",
    attempt: int = 0,
    failure_reason: str | None = None,
    updated_seconds_ago: float = 0,
) -> None:
    """A backfill row as the core proposes it (PENDING) or as a worker left it."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO ai.context_embedding_backfill (embedding_profile, context_id, "
                "status, attempt, failure_reason, updated_at) VALUES (:p, :id, :s, :a, :r, "
                "now() - make_interval(secs => :ago))"
            ),
            {
                "p": profile,
                "id": context_id,
                "s": status,
                "a": attempt,
                "r": failure_reason,
                "ago": float(updated_seconds_ago),
            },
        )


async def backdate_backfill(engine, context_id: int, *, seconds: float = STALE_SECONDS) -> None:
    """The row looks untouched for ``seconds`` (a worker that died mid-batch)."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE ai.context_embedding_backfill "
                "SET updated_at = now() - make_interval(secs => :ago) WHERE context_id = :id"
            ),
            {"id": context_id, "ago": float(seconds)},
        )


@dataclass(frozen=True)
class Row:
    status: str
    attempt: int
    failure_reason: str | None


async def backfill_row(engine, context_id: int, profile: str = PROFILE) -> Row:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT status, attempt, failure_reason FROM ai.context_embedding_backfill "
                    "WHERE embedding_profile = :p AND context_id = :id"
                ),
                {"p": profile, "id": context_id},
            )
        ).one()
    return Row(row.status, row.attempt, row.failure_reason)


async def stored_vectors(engine, context_id: int) -> dict[str, dict[str, Any]]:
    """Every vector row of one context, by profile (all columns, the vector as an array)."""
    async with engine.connect() as conn:
        rows = (
            await conn.execute(
                text("SELECT * FROM ai.context_embedding WHERE context_id = :id"),
                {"id": context_id},
            )
        ).all()
    out = {}
    for row in rows:
        values = dict(row._mapping)
        values["embedding"] = to_array(values["embedding"])
        out[row.embedding_profile] = values
    return out


async def state_row(engine, context_id: int) -> dict[str, Any]:
    """Every column of one state row (to show a statement left it alone)."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text("SELECT * FROM ai.context_ai_state WHERE context_id = :id"),
                {"id": context_id},
            )
        ).one()
    return dict(row._mapping)


# --------------------------------------------------------------------------- statements


async def claim(
    stage_pool: StagePool,
    context_ids,
    *,
    profile: str = PROFILE,
    expiry: float = EXPIRY,
) -> list[BackfillClaim]:
    return await profile_vectors.claim(
        stage_pool, embedding_profile=profile, context_ids=list(context_ids), expiry_seconds=expiry
    )


async def save(
    stage_pool: StagePool, claimed: BackfillClaim, *, embedding: np.ndarray | None = None
) -> str | None:
    return await profile_vectors.save_backfill_vector(
        stage_pool,
        claimed,
        embedding_profile=PROFILE,
        user_id=7,
        record_id=70,
        embedding=vector(f"backfill {claimed.context_id}") if embedding is None else embedding,
    )


async def settle(stage_pool: StagePool, claims, *, reason: str | None) -> None:
    await profile_vectors.settle(stage_pool, list(claims), embedding_profile=PROFILE, reason=reason)


@dataclass
class OpenClaim:
    """Another worker's claim, its transaction still open (its rows locked)."""

    transaction: asyncpg.transaction.Transaction
    claims: list[BackfillClaim]


@asynccontextmanager
async def claimed_in_open_transaction(
    session: asyncpg.Connection, context_ids, *, expiry: float = EXPIRY
) -> AsyncIterator[OpenClaim]:
    """Run the real ``CLAIM_BACKFILL`` on ``session`` inside a transaction left open: the
    claimed rows stay locked until the caller commits or rolls back (rolled back if not)."""
    transaction = session.transaction()
    await transaction.start()
    try:
        row = await session.fetchrow(
            CLAIM_BACKFILL.sql,
            *CLAIM_BACKFILL.bind(
                {
                    "embedding_profile": PROFILE,
                    "context_ids": sorted(context_ids),
                    "expiry_seconds": float(expiry),
                }
            ),
        )
        claims = [
            BackfillClaim(int(c), int(a))
            for c, a in zip(row["context_ids"], row["attempts"], strict=True)
        ]
        yield OpenClaim(transaction, claims)
    finally:
        if session.is_in_transaction():
            await transaction.rollback()


@asynccontextmanager
async def cancelled_in_open_transaction(engine, context_id: int) -> AsyncIterator[Any]:
    """A core delete (both statuses CANCELLED) in a transaction left open: the state row stays
    locked until the caller commits it (rolled back if not)."""
    async with engine.connect() as conn:
        transaction = await conn.begin()
        await conn.execute(
            text(
                "UPDATE ai.context_ai_state SET embedding_status = 'CANCELLED', "
                "keyword_status = 'CANCELLED', updated_at = now() WHERE context_id = :id"
            ),
            {"id": context_id},
        )
        try:
            yield transaction
        finally:
            if transaction.is_active:
                await transaction.rollback()


async def wait_until_blocked_on_lock(engine, limit_seconds: float = 10.0) -> None:
    """Wait until some session of this database waits on a lock (polled, never slept on)."""
    async with asyncio.timeout(limit_seconds):
        while True:
            async with engine.connect() as conn:
                if (await conn.execute(LOCK_WAITERS)).scalar_one():
                    return
            await asyncio.sleep(0.01)


# --------------------------------------------------------------------------- claim


async def test_pending_rows_are_claimed_with_the_next_attempt(engine, stage_pool):
    await make_backfill(engine, context_id=1)
    await make_backfill(engine, context_id=2, attempt=4)  # put back four times before

    claims = await claim(stage_pool, [2, 1])

    assert claims == [BackfillClaim(1, 1), BackfillClaim(2, 5)]
    assert await backfill_row(engine, 1) == Row("PROCESSING", 1, None)
    assert await backfill_row(engine, 2) == Row("PROCESSING", 5, None)


@pytest.mark.parametrize("status", ["COMPLETED", "FAILED", "CANCELLED"])
@pytest.mark.parametrize("stale", [False, True])
async def test_done_rows_are_never_claimed(engine, stage_pool, status, stale):
    reason = "input_rejected" if status == "FAILED" else None
    await make_backfill(
        engine,
        context_id=1,
        status=status,
        attempt=2,
        failure_reason=reason,
        updated_seconds_ago=STALE_SECONDS if stale else 0,
    )

    assert await claim(stage_pool, [1], expiry=SHORT_EXPIRY) == []
    assert await backfill_row(engine, 1) == Row(status, 2, reason)


async def test_processing_is_reclaimed_only_after_the_expiry(engine, stage_pool):
    await make_backfill(engine, context_id=1, status="PROCESSING", attempt=1)
    await make_backfill(
        engine, context_id=2, status="PROCESSING", attempt=1, updated_seconds_ago=STALE_SECONDS
    )

    claims = await claim(stage_pool, [1, 2], expiry=SHORT_EXPIRY)

    assert claims == [BackfillClaim(2, 2)]
    assert await backfill_row(engine, 1) == Row("PROCESSING", 1, None)
    assert await backfill_row(engine, 2) == Row("PROCESSING", 2, None)
    # The reclaim moved updated_at forward: it is fresh again for the next claimer.
    assert await claim(stage_pool, [1, 2], expiry=SHORT_EXPIRY) == []


async def test_claim_takes_only_the_named_ids_of_its_own_profile(engine, stage_pool):
    await make_backfill(engine, context_id=1)
    await make_backfill(engine, context_id=1, profile=OTHER_PROFILE)
    await make_backfill(engine, context_id=2)

    assert await claim(stage_pool, [1, 404]) == [BackfillClaim(1, 1)]
    assert await backfill_row(engine, 1, OTHER_PROFILE) == Row("PENDING", 0, None)
    assert await backfill_row(engine, 2) == Row("PENDING", 0, None)


async def test_a_claim_skips_rows_another_open_claim_holds_without_waiting(
    engine, stage_pool, other_session
):
    for context_id in (1, 2, 3, 4):
        await make_backfill(engine, context_id=context_id)

    async with claimed_in_open_transaction(other_session, [1, 2]) as theirs:
        assert theirs.claims == [BackfillClaim(1, 1), BackfillClaim(2, 1)]
        # SKIP LOCKED: the rows the other transaction holds are passed over at once.
        ours = await asyncio.wait_for(claim(stage_pool, [1, 2, 3, 4]), timeout=5)
        assert ours == [BackfillClaim(3, 1), BackfillClaim(4, 1)]
        await theirs.transaction.commit()

    # Once committed, their rows are PROCESSING and fresh: nobody else gets them.
    assert await claim(stage_pool, [1, 2, 3, 4]) == []
    for context_id in (1, 2, 3, 4):
        assert await backfill_row(engine, context_id) == Row("PROCESSING", 1, None)


async def test_rows_of_a_claim_rolled_back_are_claimable_again(engine, stage_pool, other_session):
    await make_backfill(engine, context_id=1)
    await make_backfill(engine, context_id=2)

    async with claimed_in_open_transaction(other_session, [1, 2]) as theirs:
        assert [c.context_id for c in theirs.claims] == [1, 2]
        assert await claim(stage_pool, [1, 2]) == []
        await theirs.transaction.rollback()

    assert await claim(stage_pool, [1, 2]) == [BackfillClaim(1, 1), BackfillClaim(2, 1)]


async def test_a_reclaim_racing_an_open_reclaim_of_the_same_stale_row_gets_nothing(
    engine, stage_pool, other_session
):
    await make_backfill(
        engine, context_id=1, status="PROCESSING", attempt=3, updated_seconds_ago=STALE_SECONDS
    )

    async with claimed_in_open_transaction(other_session, [1], expiry=SHORT_EXPIRY) as theirs:
        assert theirs.claims == [BackfillClaim(1, 4)]
        assert await claim(stage_pool, [1], expiry=SHORT_EXPIRY) == []
        await theirs.transaction.commit()

    # Committed: the row is fresh under attempt 4, so the stale check no longer lets anyone in.
    assert await claim(stage_pool, [1], expiry=SHORT_EXPIRY) == []
    assert await backfill_row(engine, 1) == Row("PROCESSING", 4, None)


async def test_concurrent_claimers_of_the_same_ids_never_share_a_row(engine, stage_pool):
    ids = list(range(1, 41))
    for context_id in ids:
        await make_backfill(engine, context_id=context_id)
    claimers = 8
    # Open the pool's connections first, so the race is between statements, not connects.
    await asyncio.gather(*(stage_pool.fetch_row(SLEEP) for _ in range(claimers)))
    ready = asyncio.Barrier(claimers)

    async def claimer() -> list[BackfillClaim]:
        await ready.wait()
        return await claim(stage_pool, ids)

    results = await asyncio.gather(*(claimer() for _ in range(claimers)))

    owned = [c.context_id for claims in results for c in claims]
    assert sorted(owned) == ids  # every row claimed, none by two claimers
    assert {c.attempt for claims in results for c in claims} == {1}


# --------------------------------------------------------------------------- save


async def test_save_stores_the_vector_under_the_profile_and_completes(engine, stage_pool):
    await make_state(engine, context_id=1, embedding_status="COMPLETED", keyword_status="COMPLETED")
    await make_embedding(engine, context_id=1, profile=OTHER_PROFILE, embedding=vector("old"))
    await make_backfill(engine, context_id=1)
    state_before = await state_row(engine, 1)
    other_before = (await stored_vectors(engine, 1))[OTHER_PROFILE]
    (claimed,) = await claim(stage_pool, [1])
    new_vector = vector("new profile 1")

    assert await save(stage_pool, claimed, embedding=new_vector) == "COMPLETED"

    assert await backfill_row(engine, 1) == Row("COMPLETED", 1, None)
    vectors = await stored_vectors(engine, 1)
    assert set(vectors) == {PROFILE, OTHER_PROFILE}
    mine = vectors[PROFILE]
    assert (mine["user_id"], mine["record_id"], mine["is_deleted"]) == (7, 70, False)
    assert mine["embedding"].shape == (1536,)
    np.testing.assert_allclose(mine["embedding"], new_vector, rtol=0, atol=1e-7)
    # Neither the live stages nor the other profile's vector were touched.
    assert await state_row(engine, 1) == state_before
    other_after = vectors[OTHER_PROFILE]
    np.testing.assert_array_equal(other_after.pop("embedding"), other_before.pop("embedding"))
    assert other_after == other_before


async def test_save_never_touches_is_deleted_of_any_row(engine, stage_pool):
    # A vector of this profile left by an earlier attempt whose answer was lost, and marked
    # deleted meanwhile; the other profile's row is deleted too. The upsert changes neither flag.
    await make_state(engine, context_id=1, embedding_status="COMPLETED", keyword_status="COMPLETED")
    await make_embedding(engine, context_id=1, profile=OTHER_PROFILE, is_deleted=True)
    await make_embedding(engine, context_id=1, profile=PROFILE, is_deleted=True)
    await make_backfill(engine, context_id=1)
    (claimed,) = await claim(stage_pool, [1])

    assert await save(stage_pool, claimed, embedding=vector("again")) == "COMPLETED"

    vectors = await stored_vectors(engine, 1)
    assert {p: v["is_deleted"] for p, v in vectors.items()} == {PROFILE: True, OTHER_PROFILE: True}
    np.testing.assert_allclose(vectors[PROFILE]["embedding"], vector("again"), atol=1e-7)


async def test_a_stale_attempt_writes_nothing(engine, stage_pool):
    await make_state(engine, context_id=1, embedding_status="COMPLETED", keyword_status="COMPLETED")
    await make_backfill(engine, context_id=1)
    (first,) = await claim(stage_pool, [1])
    await backdate_backfill(engine, 1)
    (second,) = await claim(stage_pool, [1], expiry=SHORT_EXPIRY)
    assert second == BackfillClaim(1, 2)

    assert await save(stage_pool, first) is None

    assert await stored_vectors(engine, 1) == {}
    assert await backfill_row(engine, 1) == Row("PROCESSING", 2, None)
    # The owner still saves.
    assert await save(stage_pool, second) == "COMPLETED"
    assert set(await stored_vectors(engine, 1)) == {PROFILE}


async def test_a_save_waiting_on_an_open_reclaim_writes_nothing(engine, stage_pool, other_session):
    await make_state(engine, context_id=1, embedding_status="COMPLETED", keyword_status="COMPLETED")
    await make_backfill(engine, context_id=1)
    (first,) = await claim(stage_pool, [1])
    await backdate_backfill(engine, 1)

    async with claimed_in_open_transaction(other_session, [1], expiry=SHORT_EXPIRY) as theirs:
        assert theirs.claims == [BackfillClaim(1, 2)]
        saving = asyncio.create_task(save(stage_pool, first))
        await wait_until_blocked_on_lock(engine)
        assert not saving.done()
        await theirs.transaction.commit()
        outcome = await saving

    assert outcome is None
    assert await stored_vectors(engine, 1) == {}
    assert await backfill_row(engine, 1) == Row("PROCESSING", 2, None)


async def test_a_save_without_a_claim_writes_nothing(engine, stage_pool):
    await make_state(engine, context_id=1, embedding_status="COMPLETED", keyword_status="COMPLETED")
    await make_backfill(engine, context_id=1)

    assert await save(stage_pool, BackfillClaim(1, 0)) is None

    assert await stored_vectors(engine, 1) == {}
    assert await backfill_row(engine, 1) == Row("PENDING", 0, None)


async def test_a_save_while_the_live_state_is_cancelled_stores_nothing(engine, stage_pool):
    await make_state(engine, context_id=1, embedding_status="CANCELLED", keyword_status="CANCELLED")
    await make_embedding(engine, context_id=1, profile=OTHER_PROFILE, is_deleted=True)
    await make_backfill(engine, context_id=1)
    (claimed,) = await claim(stage_pool, [1])

    assert await save(stage_pool, claimed) == "CANCELLED"

    assert set(await stored_vectors(engine, 1)) == {OTHER_PROFILE}
    assert await backfill_row(engine, 1) == Row("CANCELLED", 1, None)
    # Done: neither claimed nor saved again.
    assert await claim(stage_pool, [1]) == []
    assert await save(stage_pool, claimed) is None


async def test_a_save_waiting_on_a_cancelling_transaction_sees_cancelled(engine, stage_pool):
    await make_state(engine, context_id=1, embedding_status="COMPLETED", keyword_status="COMPLETED")
    await make_embedding(engine, context_id=1, profile=OTHER_PROFILE)
    await make_backfill(engine, context_id=1)
    (claimed,) = await claim(stage_pool, [1])

    async with cancelled_in_open_transaction(engine, 1) as cancelling:
        saving = asyncio.create_task(save(stage_pool, claimed))
        await wait_until_blocked_on_lock(engine)
        assert not saving.done()
        await cancelling.commit()
        outcome = await saving

    assert outcome == "CANCELLED"
    assert set(await stored_vectors(engine, 1)) == {OTHER_PROFILE}
    assert await backfill_row(engine, 1) == Row("CANCELLED", 1, None)


async def test_a_save_waiting_on_a_lock_that_changes_nothing_completes(engine, stage_pool):
    # The wait itself is no discard: a transaction holding the state row and rolling back.
    await make_state(engine, context_id=1, embedding_status="COMPLETED", keyword_status="COMPLETED")
    await make_backfill(engine, context_id=1)
    (claimed,) = await claim(stage_pool, [1])

    async with cancelled_in_open_transaction(engine, 1) as cancelling:
        saving = asyncio.create_task(save(stage_pool, claimed))
        await wait_until_blocked_on_lock(engine)
        assert not saving.done()
        await cancelling.rollback()
        outcome = await saving

    assert outcome == "COMPLETED"
    assert set(await stored_vectors(engine, 1)) == {PROFILE}


# --------------------------------------------------------------------------- settle


async def test_settle_without_a_reason_puts_rows_back_to_pending(engine, stage_pool):
    await make_backfill(engine, context_id=1)
    await make_backfill(engine, context_id=2)
    claims = await claim(stage_pool, [1, 2])

    await settle(stage_pool, claims, reason=None)

    assert await backfill_row(engine, 1) == Row("PENDING", 1, None)
    assert await backfill_row(engine, 2) == Row("PENDING", 1, None)
    assert await claim(stage_pool, [1, 2]) == [BackfillClaim(1, 2), BackfillClaim(2, 2)]


async def test_settle_with_a_reason_fails_the_row_for_good(engine, stage_pool):
    await make_backfill(engine, context_id=1)
    claims = await claim(stage_pool, [1])

    await settle(stage_pool, claims, reason="input_rejected")

    assert await backfill_row(engine, 1) == Row("FAILED", 1, "input_rejected")
    assert await claim(stage_pool, [1], expiry=0) == []


async def test_settle_changes_only_the_rows_its_attempt_still_owns(engine, stage_pool):
    await make_state(engine, context_id=3, embedding_status="COMPLETED", keyword_status="COMPLETED")
    for context_id in (1, 2, 3):
        await make_backfill(engine, context_id=context_id)
    first = await claim(stage_pool, [1, 2, 3])
    await backdate_backfill(engine, 2)
    (reclaimed,) = await claim(stage_pool, [2], expiry=SHORT_EXPIRY)
    assert await save(stage_pool, first[2]) == "COMPLETED"

    # 1: still ours; 2: reclaimed by attempt 2; 3: saved already.
    await settle(stage_pool, first, reason="input_rejected")

    assert await backfill_row(engine, 1) == Row("FAILED", 1, "input_rejected")
    assert await backfill_row(engine, 2) == Row("PROCESSING", reclaimed.attempt, None)
    assert await backfill_row(engine, 3) == Row("COMPLETED", 1, None)


async def test_a_settle_waiting_on_an_open_reclaim_changes_nothing(
    engine, stage_pool, other_session
):
    await make_backfill(engine, context_id=1)
    first = await claim(stage_pool, [1])
    await backdate_backfill(engine, 1)

    async with claimed_in_open_transaction(other_session, [1], expiry=SHORT_EXPIRY) as theirs:
        assert theirs.claims == [BackfillClaim(1, 2)]
        settling = asyncio.create_task(settle(stage_pool, first, reason=None))
        await wait_until_blocked_on_lock(engine)
        assert not settling.done()
        await theirs.transaction.commit()
        await settling

    assert await backfill_row(engine, 1) == Row("PROCESSING", 2, None)
