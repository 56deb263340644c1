"""The statements of ``app/repository/provider_batches.py`` under concurrent transactions: two
workers leasing at once never poll the same batch, a hold names the claim's attempt (a reclaim
in between holds nothing), and two settlers of one batch (a lease run out) never both settle a
row; a held row is never reclaimed however old.
"""

from __future__ import annotations

import asyncio

from sqlalchemy import text

from app.repository import profile_vectors, provider_batches
from app.repository.provider_batches import LEASE_BATCH, RETURN_TO_SYNC, NewBatch
from tests.worker.backfill_support import BackfillRow as Row
from tests.worker.backfill_support import ask, backfill_row, make_backfill
from tests.worker.open_transactions import lock_waiters_reach
from tests.worker.support import PROFILE

LEASE = {"lease_seconds": 300.0, "every_seconds": 0.0}


async def claim(stage_pool, ids: list[int], expiry: float = 600.0):
    return await profile_vectors.claim(
        stage_pool, embedding_profile=PROFILE, asks=[ask(i) for i in ids], expiry_seconds=expiry
    )


async def held(stage_pool, batch_id: str, claims) -> list[int]:
    return await provider_batches.hold(
        stage_pool, NewBatch(batch_id, PROFILE, "validating", f"file-{batch_id}", 10),
        claims=[(c.context_id, c.attempt) for c in claims],
    )  # fmt: skip


async def batch_of(engine, context_id: int) -> str | None:
    async with engine.connect() as conn:
        return (
            await conn.execute(
                text("SELECT batch_id FROM ai.context_embedding_backfill WHERE context_id = :i"),
                {"i": context_id},
            )
        ).scalar_one()


async def test_two_workers_leasing_at_once_never_poll_the_same_batch(
    engine, stage_pool, other_session
):
    for context_id in (1, 2):
        await make_backfill(engine, context_id=context_id)
        await held(stage_pool, f"batch_{context_id}", await claim(stage_pool, [context_id]))

    transaction = other_session.transaction()
    await transaction.start()
    theirs = await other_session.fetchrow(
        LEASE_BATCH.sql, *LEASE_BATCH.bind({"embedding_profile": PROFILE, "kind": "embed", **LEASE})
    )
    # SKIP LOCKED: the batch their open transaction leases is passed over at once.
    ours = await asyncio.wait_for(
        provider_batches.lease(stage_pool, embedding_profile=PROFILE, **LEASE), timeout=5
    )
    assert ours is not None and theirs is not None
    assert {ours.batch_id, theirs["batch_id"]} == {"batch_1", "batch_2"}
    await transaction.commit()
    # Both leased now: nobody else gets either until a lease runs out.
    assert await provider_batches.lease(stage_pool, embedding_profile=PROFILE, **LEASE) is None


async def test_a_batch_polled_within_the_interval_is_not_leased_again(engine, stage_pool):
    await make_backfill(engine, context_id=1)
    await held(stage_pool, "batch_1", await claim(stage_pool, [1]))
    leased = await provider_batches.lease(stage_pool, embedding_profile=PROFILE, **LEASE)
    assert leased is not None
    await provider_batches.update(
        stage_pool, batch_id="batch_1", status="in_progress", output_file_id=None,
        error_file_id=None,
    )  # fmt: skip
    polled = {"lease_seconds": 300.0, "every_seconds": 3600.0}
    assert await provider_batches.lease(stage_pool, embedding_profile=PROFILE, **polled) is None
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE ai.provider_batch SET cancel_requested = true"))
    # Asked cancelled: leased at once, whatever the interval.
    again = await provider_batches.lease(stage_pool, embedding_profile=PROFILE, **polled)
    assert again is not None and again.cancel_requested


async def test_a_hold_after_a_reclaim_holds_nothing_and_a_held_row_is_never_reclaimed(
    engine, stage_pool
):
    await make_backfill(engine, context_id=1)
    await make_backfill(engine, context_id=2)
    (first,) = await claim(stage_pool, [1])
    (reclaimed,) = await claim(stage_pool, [1], expiry=0.0)  # the first claim went stale
    assert (first.attempt, reclaimed.attempt) == (1, 2)

    assert await held(stage_pool, "batch_old", [first]) == []
    assert await batch_of(engine, 1) is None

    (other,) = await claim(stage_pool, [2])
    assert await held(stage_pool, "batch_new", [other]) == [2]
    # However stale, a held row is not claimed again.
    assert await claim(stage_pool, [2], expiry=0.0) == []
    assert await backfill_row(engine, 2) == Row("PROCESSING", 1, None)


async def test_two_settlers_of_one_batch_never_both_settle_a_row(engine, stage_pool, other_session):
    """One returns the row to the synchronous path in an open transaction; the other's fail
    waits for its row lock and then finds the row no longer held: it writes nothing."""
    await make_backfill(engine, context_id=1)
    (claimed,) = await claim(stage_pool, [1])
    await held(stage_pool, "batch_1", [claimed])

    transaction = other_session.transaction()
    await transaction.start()
    returned = await other_session.fetchrow(
        RETURN_TO_SYNC.sql,
        *RETURN_TO_SYNC.bind(
            {"embedding_profile": PROFILE, "batch_id": "batch_1", "context_ids": None}
        ),
    )
    assert list(returned["context_ids"]) == [1]
    failing = asyncio.create_task(
        provider_batches.fail_held(
            stage_pool, batch_id="batch_1", embedding_profile=PROFILE, context_id=1,
            attempt=claimed.attempt, reason="input_rejected",
        )
    )  # fmt: skip
    await lock_waiters_reach(engine, 1)  # the fail, behind the returner's open update
    await transaction.commit()

    assert await asyncio.wait_for(failing, timeout=5) is False
    assert await backfill_row(engine, 1) == Row("PENDING", 1, None)
