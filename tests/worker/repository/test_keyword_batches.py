"""The statements of ``app/repository/keyword_batches.py`` under concurrent transactions: two
claimers never claim one keyword stage (``SKIP LOCKED``), a hold names the claim's attempt (a
reclaim in between holds nothing) and a held stage is never reclaimed, by the batch claim or
the synchronous one, however old; a return and a fail of one stage never both apply.
"""

from __future__ import annotations

import asyncio

from sqlalchemy import text

from app.repository import context_ai_state, keyword_batches
from app.repository.keyword_batches import CLAIM_FOR_BATCH, RETURN_TO_SYNC, HeldItem, KeywordAsk
from app.repository.provider_batches import NewBatch
from pinlog_platform.contract.states import Stage
from pinlog_platform.contract.text_fingerprint import fingerprint
from tests.worker.api.test_backfill_route import NOTES
from tests.worker.api.test_keyword_batches import marked, stages
from tests.worker.harness import PROFILE
from tests.worker.open_transactions import lock_waiters_reach


def ask(context_id: int) -> KeywordAsk:
    return KeywordAsk(context_id, fingerprint(NOTES[context_id]), context_id, 10 * context_id)


async def claim(stage_pool, ids: list[int], expiry: float = 600.0) -> list[tuple[int, int]]:
    return await keyword_batches.claim(
        stage_pool, embedding_profile=PROFILE, asks=[ask(i) for i in ids], expiry_seconds=expiry
    )


async def hold(stage_pool, batch_id: str, claims: list[tuple[int, int]]) -> list[int]:
    return await keyword_batches.hold(
        stage_pool, NewBatch(batch_id, PROFILE, "validating", f"file-{batch_id}", 10),
        preset_version=1,
        held=[HeldItem(c, a, ((1, 0.9),)) for c, a in claims],
    )  # fmt: skip


def bound(statement, **params) -> tuple[str, list]:
    return statement.sql, statement.bind(params)


async def test_two_claimers_never_claim_one_stage(engine, stage_pool, other_session):
    for context_id in (1, 2):
        await marked(engine, context_id)
    transaction = other_session.transaction()
    await transaction.start()
    sql, args = bound(
        CLAIM_FOR_BATCH, embedding_profile=PROFILE, context_ids=[1],
        text_sha256s=[ask(1).text_sha256], user_ids=[1], record_ids=[10], expiry_seconds=600.0,
    )  # fmt: skip
    theirs = await other_session.fetchrow(sql, *args)
    assert list(theirs["context_ids"]) == [1]
    # Their open claim's row is passed over at once, not waited for.
    ours = await asyncio.wait_for(claim(stage_pool, [1, 2]), timeout=5)
    assert ours == [(2, 1)]
    await transaction.commit()
    assert await claim(stage_pool, [1]) == []  # theirs now, within the expiry


async def test_a_hold_after_a_reclaim_holds_nothing_and_a_held_stage_is_never_reclaimed(
    engine, stage_pool
):
    for context_id in (1, 2):
        await marked(engine, context_id)
    (first,) = await claim(stage_pool, [1])
    (reclaimed,) = await claim(stage_pool, [1], expiry=0.0)  # never held: stale at once
    assert (first[1], reclaimed[1]) == (1, 2)
    assert await hold(stage_pool, "batch_old", [first]) == []
    assert (await stages(engine))[1] == ("PROCESSING", None, True)

    (other,) = await claim(stage_pool, [2])
    assert await hold(stage_pool, "batch_new", [other]) == [2]
    # However stale, a held stage is claimed by neither path.
    assert await claim(stage_pool, [2], expiry=0.0) == []
    sync = await context_ai_state.claim(stage_pool, Stage.KEYWORD, 2, expiry_seconds=0.0)
    assert not sync.claimed
    assert (await stages(engine))[2] == ("PROCESSING", "batch_new", True)
    items = await keyword_batches.read_items(stage_pool, batch_id="batch_new")
    assert items.items[2] == HeldItem(2, 1, ((1, 0.9),)) and items.preset_version == 1


async def test_a_return_and_a_fail_of_one_stage_never_both_apply(engine, stage_pool, other_session):
    """One settler returns the stage in an open transaction; the other's fail waits for the
    row lock and then finds the stage no longer held: it writes nothing."""
    await marked(engine, 1)
    claims = await claim(stage_pool, [1])
    await hold(stage_pool, "batch_1", claims)

    transaction = other_session.transaction()
    await transaction.start()
    sql, args = bound(RETURN_TO_SYNC, batch_id="batch_1", context_ids=None)
    assert list((await other_session.fetchrow(sql, *args))["context_ids"]) == [1]
    failing = asyncio.create_task(
        keyword_batches.fail_held(
            stage_pool, batch_id="batch_1", context_id=1, attempt=1, reason="input_rejected"
        )
    )
    await lock_waiters_reach(engine, 1)
    await transaction.commit()

    assert await asyncio.wait_for(failing, timeout=5) is False
    assert (await stages(engine))[1] == ("PROCESSING", None, False)
    async with engine.connect() as conn:
        failure = await conn.execute(
            text("SELECT keyword_failure FROM ai.context_ai_state WHERE context_id = 1")
        )
        assert failure.scalar_one() is None
