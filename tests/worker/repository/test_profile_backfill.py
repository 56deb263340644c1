"""The re-embedding backfill's own row (``ai.context_embedding_backfill``, 0060) against real
concurrent transactions: the claim (PENDING or stale, ``attempt + 1``, ``SKIP LOCKED``), the
save that locks the live state row first and loses to a cancellation, and the settle back to
``PENDING`` or ``FAILED``, each only while its attempt owns the row
(``app.repository.profile_vectors``; docs/operations.md "Switching the embedding profile").
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from app.repository import profile_vectors
from app.repository.named_statements import compile_named
from app.repository.profile_vectors import BackfillAsk, BackfillClaim
from app.repository.stage_pool import StagePool
from tests.worker.backfill_support import BackfillRow as Row
from tests.worker.backfill_support import (
    ask,
    backfill_row,
    claimed,
    claimed_in_open_transaction,
    make_backfill,
    set_backfill,
    vector_rows,
)
from tests.worker.open_transactions import (
    cancel_context,
    cancelled_in_open_transaction,
    finished_behind_lock,
)
from tests.worker.support import PROFILE, make_embedding, make_state, state_row, vector

OTHER_PROFILE = "old-profile-1536-cosine-v1"
EXPIRY = 600
# A short expiry for reclaims: rows backdated by STALE_SECONDS are past it, fresh ones are not.
SHORT_EXPIRY = 5
STALE_SECONDS = 60
SLEEP = compile_named("SELECT pg_sleep(0.05)")


# --------------------------------------------------------------------------- statements


async def claim(
    stage_pool: StagePool,
    context_ids,
    *,
    profile: str = PROFILE,
    expiry: float = EXPIRY,
) -> list[BackfillClaim]:
    return await profile_vectors.claim(
        stage_pool,
        embedding_profile=profile,
        asks=[ask(c) for c in sorted(set(context_ids))],
        expiry_seconds=expiry,
    )


async def save(
    stage_pool: StagePool, claim_: BackfillClaim, *, embedding: np.ndarray | None = None
) -> str | None:
    return await profile_vectors.save_backfill_vector(
        stage_pool,
        claim_,
        embedding_profile=PROFILE,
        embedding=vector(f"backfill {claim_.context_id}") if embedding is None else embedding,
    )


async def settle(stage_pool: StagePool, claims, *, reason: str | None) -> None:
    await profile_vectors.settle(stage_pool, list(claims), embedding_profile=PROFILE, reason=reason)


# --------------------------------------------------------------------------- claim


async def test_pending_rows_are_claimed_with_the_next_attempt(engine, stage_pool):
    await make_backfill(engine, context_id=1)
    await make_backfill(engine, context_id=2, attempt=4)  # put back four times before

    claims = await claim(stage_pool, [2, 1])

    assert claims == [claimed(1, 1), claimed(2, 5)]
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

    assert claims == [claimed(2, 2)]
    assert await backfill_row(engine, 1) == Row("PROCESSING", 1, None)
    assert await backfill_row(engine, 2) == Row("PROCESSING", 2, None)
    # The reclaim moved updated_at forward: it is fresh again for the next claimer.
    assert await claim(stage_pool, [1, 2], expiry=SHORT_EXPIRY) == []


async def test_claim_takes_only_the_named_ids_of_its_own_profile(engine, stage_pool):
    await make_backfill(engine, context_id=1)
    await make_backfill(engine, context_id=1, profile=OTHER_PROFILE)
    await make_backfill(engine, context_id=2)

    assert await claim(stage_pool, [1, 404]) == [claimed(1, 1)]
    assert await backfill_row(engine, 1, OTHER_PROFILE) == Row("PENDING", 0, None)
    assert await backfill_row(engine, 2) == Row("PENDING", 0, None)


async def test_a_claim_skips_rows_another_open_claim_holds_without_waiting(
    engine, stage_pool, other_session
):
    for context_id in (1, 2, 3, 4):
        await make_backfill(engine, context_id=context_id)

    async with claimed_in_open_transaction(other_session, [1, 2]) as theirs:
        assert theirs.claims == [claimed(1, 1), claimed(2, 1)]
        # SKIP LOCKED: the rows the other transaction holds are passed over at once.
        ours = await asyncio.wait_for(claim(stage_pool, [1, 2, 3, 4]), timeout=5)
        assert ours == [claimed(3, 1), claimed(4, 1)]
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

    assert await claim(stage_pool, [1, 2]) == [claimed(1, 1), claimed(2, 1)]


async def test_a_reclaim_racing_an_open_reclaim_of_the_same_stale_row_gets_nothing(
    engine, stage_pool, other_session
):
    await make_backfill(
        engine, context_id=1, status="PROCESSING", attempt=3, updated_seconds_ago=STALE_SECONDS
    )

    async with claimed_in_open_transaction(other_session, [1], expiry=SHORT_EXPIRY) as theirs:
        assert theirs.claims == [claimed(1, 4)]
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
    other_before = (await vector_rows(engine, 1))[OTHER_PROFILE]
    (claimed,) = await claim(stage_pool, [1])
    new_vector = vector("new profile 1")

    assert await save(stage_pool, claimed, embedding=new_vector) == "COMPLETED"

    assert await backfill_row(engine, 1) == Row("COMPLETED", 1, None)
    vectors = await vector_rows(engine, 1)
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

    vectors = await vector_rows(engine, 1)
    assert {p: v["is_deleted"] for p, v in vectors.items()} == {PROFILE: True, OTHER_PROFILE: True}
    np.testing.assert_allclose(vectors[PROFILE]["embedding"], vector("again"), atol=1e-7)


async def test_a_stale_attempt_writes_nothing(engine, stage_pool):
    await make_state(engine, context_id=1, embedding_status="COMPLETED", keyword_status="COMPLETED")
    await make_backfill(engine, context_id=1)
    (first,) = await claim(stage_pool, [1])
    await set_backfill(engine, PROFILE, 1, updated_at_ago=STALE_SECONDS)
    (second,) = await claim(stage_pool, [1], expiry=SHORT_EXPIRY)
    assert second == claimed(1, 2)

    assert await save(stage_pool, first) is None

    assert await vector_rows(engine, 1) == {}
    assert await backfill_row(engine, 1) == Row("PROCESSING", 2, None)
    # The owner still saves.
    assert await save(stage_pool, second) == "COMPLETED"
    assert set(await vector_rows(engine, 1)) == {PROFILE}


async def test_a_save_waiting_on_an_open_reclaim_writes_nothing(engine, stage_pool, other_session):
    await make_state(engine, context_id=1, embedding_status="COMPLETED", keyword_status="COMPLETED")
    await make_backfill(engine, context_id=1)
    (first,) = await claim(stage_pool, [1])
    await set_backfill(engine, PROFILE, 1, updated_at_ago=STALE_SECONDS)

    async with claimed_in_open_transaction(other_session, [1], expiry=SHORT_EXPIRY) as theirs:
        assert theirs.claims == [claimed(1, 2)]
        outcome = await finished_behind_lock(
            engine, save(stage_pool, first), theirs.transaction.commit
        )

    assert outcome is None
    assert await vector_rows(engine, 1) == {}
    assert await backfill_row(engine, 1) == Row("PROCESSING", 2, None)


async def test_a_save_without_a_claim_writes_nothing(engine, stage_pool):
    await make_state(engine, context_id=1, embedding_status="COMPLETED", keyword_status="COMPLETED")
    await make_backfill(engine, context_id=1)

    assert await save(stage_pool, claimed(1, 0)) is None

    assert await vector_rows(engine, 1) == {}
    assert await backfill_row(engine, 1) == Row("PENDING", 0, None)


async def test_a_save_while_the_live_state_is_cancelled_stores_nothing(engine, stage_pool):
    await make_state(engine, context_id=1, embedding_status="COMPLETED", keyword_status="COMPLETED")
    await make_embedding(engine, context_id=1, profile=OTHER_PROFILE)
    await make_backfill(engine, context_id=1)
    (mine,) = await claim(stage_pool, [1])
    await cancel_context(engine, context_id=1)  # deleted after the claim

    assert await save(stage_pool, mine) == "CANCELLED"

    assert set(await vector_rows(engine, 1)) == {OTHER_PROFILE}
    assert await backfill_row(engine, 1) == Row("CANCELLED", 1, None)
    # Done: neither claimed nor saved again.
    assert await claim(stage_pool, [1]) == []
    assert await save(stage_pool, mine) is None


async def test_a_context_no_longer_live_is_not_claimed(engine, stage_pool):
    """Deleted (its state CANCELLED) before the claim: no claim, so no provider call."""
    await make_state(engine, context_id=1, embedding_status="CANCELLED", keyword_status="CANCELLED")
    await make_backfill(engine, context_id=1)

    assert await claim(stage_pool, [1]) == []
    assert await backfill_row(engine, 1) == Row("PENDING", 0, None)


@pytest.mark.parametrize(
    ("asked", "why"),
    [
        (ask(1, "another text"), "text"),
        (BackfillAsk(1, ask(1).text_sha256, 8, 70), "user"),
        (BackfillAsk(1, ask(1).text_sha256, 7, 80), "record"),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
async def test_a_text_or_owner_other_than_the_cores_is_not_claimed(engine, stage_pool, asked, why):
    await make_backfill(engine, context_id=1)

    claims = await profile_vectors.claim(
        stage_pool, embedding_profile=PROFILE, asks=[asked], expiry_seconds=EXPIRY
    )

    assert claims == [], why
    assert await backfill_row(engine, 1) == Row("PENDING", 0, None)


@pytest.mark.parametrize(
    ("ending", "outcome", "profiles"),
    [
        pytest.param("commit", "CANCELLED", {OTHER_PROFILE}, id="cancelled"),
        # The wait itself is no discard: a transaction holding the state row and rolling back.
        pytest.param("rollback", "COMPLETED", {PROFILE, OTHER_PROFILE}, id="changes-nothing"),
    ],
)
async def test_a_save_waiting_on_a_cancelling_transaction_sees_how_it_ends(
    engine, stage_pool, ending, outcome, profiles
):
    await make_state(engine, context_id=1, embedding_status="COMPLETED", keyword_status="COMPLETED")
    await make_embedding(engine, context_id=1, profile=OTHER_PROFILE)
    await make_backfill(engine, context_id=1)
    (claimed,) = await claim(stage_pool, [1])

    async with cancelled_in_open_transaction(engine, 1) as cancelling:
        saved = await finished_behind_lock(
            engine, save(stage_pool, claimed), getattr(cancelling, ending)
        )

    assert saved == outcome
    assert set(await vector_rows(engine, 1)) == profiles
    assert await backfill_row(engine, 1) == Row(outcome, 1, None)


# --------------------------------------------------------------------------- settle


async def test_settle_without_a_reason_puts_rows_back_to_pending(engine, stage_pool):
    await make_backfill(engine, context_id=1)
    await make_backfill(engine, context_id=2)
    claims = await claim(stage_pool, [1, 2])

    await settle(stage_pool, claims, reason=None)

    assert await backfill_row(engine, 1) == Row("PENDING", 1, None)
    assert await backfill_row(engine, 2) == Row("PENDING", 1, None)
    assert await claim(stage_pool, [1, 2]) == [claimed(1, 2), claimed(2, 2)]


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
    await set_backfill(engine, PROFILE, 2, updated_at_ago=STALE_SECONDS)
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
    await set_backfill(engine, PROFILE, 1, updated_at_ago=STALE_SECONDS)

    async with claimed_in_open_transaction(other_session, [1], expiry=SHORT_EXPIRY) as theirs:
        assert theirs.claims == [claimed(1, 2)]
        await finished_behind_lock(
            engine, settle(stage_pool, first, reason=None), theirs.transaction.commit
        )

    assert await backfill_row(engine, 1) == Row("PROCESSING", 2, None)
