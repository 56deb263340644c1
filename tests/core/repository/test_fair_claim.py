"""The rescan's claim is fair to every member (docs/scaling.md "Fairness"): round robin over
owners among due rows, oldest first within an owner, rows without an owner as one owner; two
claims at once never take a row twice."""

from __future__ import annotations

import asyncio

from core_service.repository import context_ai_state
from core_service.repository.context_ai_state import Expiries
from tests.worker.support import make_state

EXPIRIES = Expiries(pending_seconds=300, processing_seconds=600)


async def _claim(engine, batch_size: int) -> list[int]:
    async with engine.begin() as conn:
        claimed = await context_ai_state.claim_stale(
            conn, expiries=EXPIRIES, max_retry=3, batch_size=batch_size
        )
    return sorted(context_id for context_id, _ in claimed)


async def _rows(engine, owner: int | None, first_id: int, count: int, oldest: float) -> list[int]:
    """``count`` stale rows of ``owner``, ids from ``first_id``, each a second younger."""
    ids = list(range(first_id, first_id + count))
    for offset, context_id in enumerate(ids):
        await make_state(
            engine, context_id=context_id, user_id=owner, record_id=1,
            updated_seconds_ago=oldest - offset,
        )  # fmt: skip
    return ids


async def test_owners_take_turns_oldest_first_and_rows_without_an_owner_are_one_owner(engine):
    importer = await _rows(engine, 1, 1, 50, oldest=5000)  # older than everyone else's
    writer = await _rows(engine, 2, 100, 3, oldest=400)
    legacy = await _rows(engine, None, 200, 2, oldest=4000)

    first = await _claim(engine, 6)
    second = await _claim(engine, 6)

    assert first == sorted([*importer[:2], *writer[:2], *legacy[:2]])
    assert second == sorted([*importer[2:7], writer[2]])


async def test_two_claims_at_once_never_take_a_row_twice(engine):
    await _rows(engine, 1, 1, 30, oldest=5000)
    await _rows(engine, 2, 100, 30, oldest=5000)

    claims = await asyncio.gather(*(_claim(engine, 10) for _ in range(4)))
    # Under SKIP LOCKED a claim racing another may come back short; what it skipped stays due.
    while (more := await _claim(engine, 10)) != []:
        claims.append(more)

    taken = [context_id for claim in claims for context_id in claim]
    assert all(len(claim) <= 10 for claim in claims)
    assert len(taken) == len(set(taken)) == 60  # every row once, none twice
