"""The embedding-profile switch's statements (``core_service/repository/embedding_switch.py``,
0060 and 0061; docs/operations.md "Switching the embedding profile"): every transition of the
switch row from every state, guarded in its WHERE clause, with one winner when two operators
race; the backfill rows the core seeds, proposes and unmarks (live contexts only, in id order,
disjoint between concurrent proposals); the coverage figures; the shared pace of the batch
slots, measured against the clock with two engines taking at once; and the stale judgments a
cutover leaves for ``keyword_reprocess``."""

from __future__ import annotations

import asyncio
import time

import pytest
from sqlalchemy import text

from core_service.repository import embedding_switch, keyword_reprocess
from core_service.repository.db import autocommit, create_engine, transaction
from core_service.repository.embedding_switch import BackfillSource
from core_service.service.profile_in_use import read_profile_in_use
from tests.core import support as facts
from tests.core.harness import bearer
from tests.core.support import (
    LIFECYCLE_OPERATIONS,
    TARGET,
    THIRD,
    add_vector,
    backfill_rows,
    created,
    judged,
    make_judged,
    switch_cut_over,
    switch_finish,
    switch_roll_back,
    switch_row,
    switch_start,
)
from tests.worker.backfill_support import set_backfill
from tests.worker.harness import PROFILE

# Long enough that a row sent in a test is never due for resending within it (seconds).
RESEND = 600.0
EXPIRY = 600.0


# --- transitions -----------------------------------------------------------------------------


async def _put_switch_in(engine, state: str | None) -> None:
    """The switch row in ``state`` by the statements themselves: ``None`` no row, ``idle``
    rolled back before a cutover, ``backfilling`` started, ``cut_over`` cut over (PROFILE to
    TARGET), ``rolling_back`` rolled back after it."""
    if state is None:
        return
    async with autocommit(engine) as conn:
        assert await switch_start(conn, target=TARGET, rate=50)
        if state == "idle":
            assert await switch_roll_back(conn)
        elif state in ("cut_over", "rolling_back"):
            assert await switch_cut_over(conn)
        if state == "rolling_back":
            assert await switch_roll_back(conn)


OPERATIONS = {
    "start": lambda conn: switch_start(conn, target=TARGET, rate=7),
    "start_third": lambda conn: switch_start(conn, target=THIRD, rate=7),
    "start_in_use": lambda conn: switch_start(conn, target=PROFILE, rate=7),
    "cut_over": switch_cut_over,
    "roll_back": switch_roll_back,
    "finish": switch_finish,
    "move_to_idle": lambda conn: _move_to_idle(conn),
}


async def _move_to_idle(conn):
    row = await embedding_switch.read(conn)
    if row is None:
        return None
    return await embedding_switch.move_to_idle(
        conn, generation=row.generation, in_use=row.profile_in_use, window_seconds=0
    )


# (state before, operation) -> (state, profile in use, other profile) after; None: refused,
# the row unchanged. "start_in_use" names the profile in use as the target.
TRANSITIONS = {
    (None, "start"): ("backfilling", PROFILE, TARGET),
    (None, "start_third"): ("backfilling", PROFILE, THIRD),
    (None, "start_in_use"): None,
    (None, "cut_over"): None,
    (None, "roll_back"): None,
    (None, "finish"): None,
    (None, "move_to_idle"): None,
    ("idle", "start"): ("backfilling", PROFILE, TARGET),
    ("idle", "start_third"): ("backfilling", PROFILE, THIRD),
    ("idle", "start_in_use"): None,
    ("idle", "cut_over"): None,
    ("idle", "roll_back"): None,
    ("idle", "finish"): ("idle", PROFILE, None),
    ("idle", "move_to_idle"): None,
    ("backfilling", "start"): None,
    ("backfilling", "start_third"): None,
    ("backfilling", "start_in_use"): None,
    ("backfilling", "cut_over"): ("cut_over", TARGET, PROFILE),
    ("backfilling", "roll_back"): ("idle", PROFILE, TARGET),
    ("backfilling", "finish"): None,
    ("backfilling", "move_to_idle"): None,
    ("cut_over", "start"): None,
    ("cut_over", "start_third"): None,
    ("cut_over", "start_in_use"): None,
    ("cut_over", "cut_over"): None,
    ("cut_over", "roll_back"): ("rolling_back", PROFILE, TARGET),
    ("cut_over", "finish"): ("idle", TARGET, None),
    ("cut_over", "move_to_idle"): None,
    ("rolling_back", "start"): None,
    ("rolling_back", "start_third"): None,
    ("rolling_back", "start_in_use"): None,
    ("rolling_back", "cut_over"): None,
    ("rolling_back", "roll_back"): None,
    ("rolling_back", "finish"): None,
    ("rolling_back", "move_to_idle"): ("idle", PROFILE, TARGET),
}


@pytest.mark.parametrize(("before", "operation"), list(TRANSITIONS), ids=str)
async def test_every_operation_from_every_state(engine, before, operation):
    await _put_switch_in(engine, before)
    row_before = await switch_row(engine)

    async with autocommit(engine) as conn:
        returned = await OPERATIONS[operation](conn)

    expected = TRANSITIONS[(before, operation)]
    row_after = await switch_row(engine)
    if expected is None:
        assert returned is None
        assert row_after == row_before
        return
    assert returned == row_after
    assert (row_after.state, row_after.profile_in_use, row_after.other_profile) == expected
    before_generation = 0 if row_before is None else row_before.generation
    assert row_after.generation == before_generation + 1  # every move advances it
    if operation.startswith("start"):
        assert row_after.rate_per_second == 7
        assert row_after.started_at is not None and row_after.cut_over_at is None
    if operation == "cut_over":
        assert row_after.cut_over_at is not None


async def test_two_starts_on_separate_connections_without_a_row_have_one_winner(engine):
    """The first insert is not committed when the second arrives: the second waits for it,
    then finds a switch under way and is refused."""
    async with engine.connect() as first:
        await first.begin()
        won = await switch_start(first, target=TARGET, rate=50)
        second = asyncio.create_task(_start_alone(engine, THIRD))
        await facts.lock_waiters_reach(engine, 1)
        await first.commit()
    lost = await asyncio.wait_for(second, 5)

    assert won is not None and lost is None
    row = await switch_row(engine)
    assert (row.state, row.profile_in_use, row.other_profile) == ("backfilling", PROFILE, TARGET)


async def _start_alone(engine, target: str):
    async with autocommit(engine) as conn:
        return await switch_start(conn, target=target, rate=50)


@pytest.mark.parametrize("operation", ["start", "cut_over"])
async def test_two_operators_racing_on_the_row_get_one_winner(engine, operation):
    """Both statements queue on the switch row behind a blocker; whichever goes first wins,
    the other is refused by its guard, and the profiles swap once."""
    await _put_switch_in(engine, "idle" if operation == "start" else "backfilling")
    if operation == "start":
        calls = [_start_alone(engine, TARGET), _start_alone(engine, THIRD)]
    else:
        calls = [_cut_over_alone(engine), _cut_over_alone(engine)]

    results = await facts.racing_behind_the_switch_row(engine, calls)

    winners = [row for row in results if row is not None]
    assert len(winners) == 1 and results.count(None) == 1
    row = await switch_row(engine)
    assert row == winners[0]
    if operation == "start":
        assert (row.state, row.profile_in_use) == ("backfilling", PROFILE)
        assert row.other_profile in (TARGET, THIRD)
    else:
        assert (row.state, row.profile_in_use, row.other_profile) == ("cut_over", TARGET, PROFILE)


async def _cut_over_alone(engine):
    async with autocommit(engine) as conn:
        return await switch_cut_over(conn)


# A move made from a generation read before another move: (state to read in, the moves
# made meanwhile that bring the row back to the same state and profiles, the late move).
STALE_MOVES = {
    "start": ("idle", ["start", "roll_back"], "start"),
    "cut_over": ("backfilling", ["roll_back", "start"], "cut_over"),
    "roll_back": ("backfilling", ["roll_back", "start"], "roll_back"),
    "finish": ("cut_over", ["roll_back", "move_to_idle", "start", "cut_over"], "finish"),
    "move_to_idle": ("rolling_back", ["move_to_idle", "start", "cut_over", "roll_back"],
                     "move_to_idle"),
}  # fmt: skip


async def _late_move(conn, operation: str, seen):
    """``operation`` as a command that read ``seen`` makes it."""
    if operation == "start":
        return await embedding_switch.start(
            conn, in_use=PROFILE, target=TARGET, rate=7, generation=seen.generation
        )
    if operation == "cut_over":
        return await embedding_switch.cut_over(
            conn, generation=seen.generation, target=TARGET, force=True
        )
    if operation == "roll_back":
        return await embedding_switch.roll_back(conn, generation=seen.generation)
    if operation == "finish":
        return await embedding_switch.finish(
            conn, generation=seen.generation, in_use=TARGET, force=False, window_seconds=0
        )
    return await embedding_switch.move_to_idle(
        conn, generation=seen.generation, in_use=PROFILE, window_seconds=0
    )


@pytest.mark.parametrize("operation", list(STALE_MOVES))
async def test_a_move_from_a_row_read_before_other_moves_is_refused(engine, operation):
    """The row is back in the state and profiles the command read (A-B-A), but it moved
    meanwhile: the late move is refused and changes nothing."""
    state, meanwhile, late = STALE_MOVES[operation]
    await _put_switch_in(engine, state)
    seen = await switch_row(engine)
    async with autocommit(engine) as conn:
        for move in meanwhile:
            assert await OPERATIONS[move](conn) is not None, move
    before = await switch_row(engine)
    assert (before.state, before.profile_in_use, before.other_profile) == (
        seen.state,
        seen.profile_in_use,
        seen.other_profile,
    )

    async with autocommit(engine) as conn:
        assert await _late_move(conn, late, seen) is None

    assert await switch_row(engine) == before


@pytest.mark.parametrize("operation", ["cut_over", "roll_back", "finish"])
async def test_a_move_waiting_behind_an_uncommitted_move_is_refused_once_it_commits(
    engine, operation
):
    """Two operators on two connections: the first's move is not committed when the second's
    arrives with the same generation; the second waits for the row, then finds it moved."""
    await _put_switch_in(engine, "cut_over" if operation == "finish" else "backfilling")
    seen = await switch_row(engine)
    async with engine.connect() as first:
        await first.begin()
        won = await (switch_roll_back(first) if operation == "finish" else switch_cut_over(first))
        assert won is not None
        late = asyncio.create_task(_late_alone(engine, operation, seen))
        await facts.lock_waiters_reach(engine, 1)
        await first.commit()
    assert await asyncio.wait_for(late, 5) is None
    assert await switch_row(engine) == won


async def test_two_processes_moving_a_rollback_to_idle_have_one_winner(engine):
    """Two core processes' backfill loops find the rollback done at once: one moves the
    switch, the other's statement (same generation) is refused behind it."""
    await _put_switch_in(engine, "rolling_back")
    seen = await switch_row(engine)

    async def move():
        async with autocommit(engine) as conn:
            return await _late_move(conn, "move_to_idle", seen)

    results = await facts.racing_behind_the_switch_row(engine, [move(), move()])

    winners = [row for row in results if row is not None]
    assert len(winners) == 1 and results.count(None) == 1
    assert await switch_row(engine) == winners[0]
    assert winners[0].generation == seen.generation + 1


async def _late_alone(engine, operation, seen):
    async with autocommit(engine) as conn:
        if operation == "finish":
            # seen is cut_over to TARGET; the racing rollback restores PROFILE.
            return await embedding_switch.finish(
                conn, generation=seen.generation, in_use=TARGET, force=False, window_seconds=0
            )
        return await _late_move(conn, operation, seen)


# --- what a move protects ----------------------------------------------------------------------


async def test_cut_over_refuses_an_incomplete_target_or_unstamped_judgments_in_its_statement(
    engine, core_with_fake_worker
):
    core = core_with_fake_worker
    covered = await judged(core, engine, "대상 벡터 있음", place="p1")
    failed = await judged(core, engine, "대상 실패", place="p2")
    await add_vector(engine, covered, TARGET)
    async with autocommit(engine) as conn:
        await switch_start(conn)
        await embedding_switch.seed(conn, profile=TARGET, completed_only=False, generation=None)
    await set_backfill(engine, TARGET, failed, status="PROCESSING")

    async with autocommit(engine) as conn:
        incomplete = await switch_cut_over(conn, force=False)
        await embedding_switch.stamp_judgment_profile(conn, profile=PROFILE, batch=100)
        still_incomplete = await switch_cut_over(conn, force=False)
    await set_backfill(engine, TARGET, failed, status="FAILED", failure_reason="rejected")
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE ai.context_keyword_analysis SET embedding_profile = NULL "
                 "WHERE context_id = :id"),
            {"id": covered},
        )  # fmt: skip
    async with autocommit(engine) as conn:
        unstamped = await switch_cut_over(conn, force=True)
        unstamped_exists = await embedding_switch.unstamped_judgments(conn)
        await embedding_switch.stamp_judgment_profile(conn, profile=PROFILE, batch=100)
        moved = await switch_cut_over(conn, force=False)

    assert (incomplete, still_incomplete, unstamped) == (None, None, None)
    assert unstamped_exists
    assert moved is not None and moved.state == "cut_over"


async def _cut_over_with(engine, core, *, covered: int, missing: int) -> list[int]:
    """``covered + missing`` judged notes with a vector of PROFILE, ``covered`` of them also
    of TARGET, the switch cut over to TARGET by force (its coverage incomplete); the ids."""
    ids = [await judged(core, engine, f"메모 {n}", place=f"p{n}") for n in range(covered + missing)]
    for context_id in ids[:covered]:
        await add_vector(engine, context_id, TARGET)
    async with autocommit(engine) as conn:
        await switch_start(conn)
        await embedding_switch.stamp_judgment_profile(conn, profile=PROFILE, batch=100)
        assert await switch_cut_over(conn, force=True)
    return ids


async def test_finish_refuses_while_the_profile_in_use_lacks_vectors_or_has_open_rows(
    engine, core_with_fake_worker
):
    """Issue 28's instance, smaller: a forced cutover with 2 of 3 notes lacking a vector of
    the profile in use; finish is refused until they have one (no open row, failures with
    force only), and only then removes the previous profile's vectors."""
    ids = await _cut_over_with(engine, core_with_fake_worker, covered=1, missing=2)
    refused = []
    async with autocommit(engine) as conn:
        refused.append(await switch_finish(conn))
        await embedding_switch.seed(conn, profile=TARGET, completed_only=True, generation=None)
    await add_vector(engine, ids[1], TARGET)
    await set_backfill(engine, TARGET, ids[1], status="COMPLETED")
    await set_backfill(engine, TARGET, ids[2], status="FAILED", failure_reason="rejected")
    async with autocommit(engine) as conn:
        refused.append(await switch_finish(conn))  # one failed: only with force
        coverage = await embedding_switch.coverage(
            conn, profile=TARGET, in_use=TARGET, window_seconds=60
        )
    await set_backfill(engine, TARGET, ids[2], status="PENDING")
    async with autocommit(engine) as conn:
        refused.append(await switch_finish(conn, force=True))  # an open row of it
    await set_backfill(engine, TARGET, ids[2], status="FAILED", failure_reason="rejected")
    async with autocommit(engine) as conn:
        finished = await switch_finish(conn, force=True)
        while await embedding_switch.remove_other_profiles(
            conn, in_use=TARGET, generation=finished.generation, batch=100
        ):
            pass

    assert refused == [None, None, None]
    assert (coverage.done, coverage.missing_in_use) == (2, 1)
    assert (finished.state, finished.other_profile) == ("idle", None)
    # The note whose backfill failed keeps its only vector; the others lost the old one.
    assert await facts.vector_profiles(engine, ids) == {
        ids[0]: [TARGET], ids[1]: [TARGET], ids[2]: [PROFILE],
    }  # fmt: skip


async def test_finish_waits_out_the_profile_cache_window_in_its_statement(engine):
    await _put_switch_in(engine, "cut_over")
    seen = await switch_row(engine)
    async with autocommit(engine) as conn:
        early = await embedding_switch.finish(
            conn, generation=seen.generation, in_use=TARGET, force=False, window_seconds=3600
        )
    assert early is None
    assert (await switch_row(engine)).state == "cut_over"


async def test_removal_keeps_a_notes_last_vector_and_stops_once_another_switch_starts(
    engine, core_with_fake_worker
):
    """A note embedded under the previous profile by a process still acting on its cached
    profile has no vector of the profile in use: the removal keeps its vector. A removal
    statement after a new start removes nothing."""
    ids = await _cut_over_with(engine, core_with_fake_worker, covered=2, missing=0)
    async with autocommit(engine) as conn:
        finished = await switch_finish(conn)
    late = await judged(core_with_fake_worker, engine, "캐시된 프로필로", place="late")
    async with autocommit(engine) as conn:
        while await embedding_switch.remove_other_profiles(
            conn, in_use=TARGET, generation=finished.generation, batch=100
        ):
            pass
    assert await facts.vector_profiles(engine, [*ids, late]) == {
        ids[0]: [TARGET], ids[1]: [TARGET], late: [PROFILE],
    }  # fmt: skip

    async with autocommit(engine) as conn:
        await switch_start(conn, in_use=TARGET, target=THIRD)
    await add_vector(engine, ids[0], THIRD)
    async with autocommit(engine) as conn:
        after_start = await embedding_switch.remove_other_profiles(
            conn, in_use=TARGET, generation=finished.generation, batch=100
        )
    assert after_start == 0
    assert await facts.vector_profiles(engine, [ids[0]]) == {ids[0]: [TARGET, THIRD]}


async def _stage_at(engine, context_id: int, status: str, seconds_ago: float) -> None:
    """The context's embedding stage ``status``, its state row written ``seconds_ago``."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE ai.context_ai_state SET embedding_status = :st, "
                "updated_at = now() - make_interval(secs => :ago) WHERE context_id = :id"
            ),
            {"st": status, "id": context_id, "ago": seconds_ago},
        )


async def test_a_stage_sent_within_the_cache_window_keeps_the_switch_from_leaving(
    engine, core_with_fake_worker
):
    """A note dispatched within the cache window after the rollback may be embedded under the
    abandoned profile alone: while its stage is open the loop's move to idle (and a finish)
    is refused; a stage begun after the window does not hold it."""
    await _put_switch_in(engine, "rolling_back")
    _, early = await created(core_with_fake_worker, "창 안에서 보냄", place="early")
    _, fresh = await created(core_with_fake_worker, "창 뒤에 보냄", place="fresh")
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE core.embedding_switch SET updated_at = now() - interval '60 seconds'")
        )
    await _stage_at(engine, early, "PROCESSING", seconds_ago=58)
    await _stage_at(engine, fresh, "PROCESSING", seconds_ago=0)
    async with autocommit(engine) as conn:
        held = await _move_to_idle_within(conn, 5)
        in_flight = await embedding_switch.stages_open_from_before(conn, window_seconds=5)
    await add_vector(engine, early, PROFILE)
    await _stage_at(engine, early, "COMPLETED", seconds_ago=0)
    async with autocommit(engine) as conn:
        moved = await _move_to_idle_within(conn, 5)

    assert held is None and in_flight == 1
    assert moved is not None and moved.state == "idle"


async def _move_to_idle_within(conn, window_seconds: float):
    row = await embedding_switch.read(conn)
    return await embedding_switch.move_to_idle(
        conn, generation=row.generation, in_use=row.profile_in_use, window_seconds=window_seconds
    )


# --- seed, coverage, failures ----------------------------------------------------------------


async def test_seed_proposes_live_contexts_without_a_vector_and_coverage_counts_them(
    engine, core_with_fake_worker
):
    core = core_with_fake_worker
    only_in_use = await judged(core, engine, "지금 프로필만", place="p1")
    both = await judged(core, engine, "두 프로필 다", place="p2")
    await add_vector(engine, both, TARGET)
    _, pending = await created(core, "아직 임베딩 전", place="p3")
    hidden_target = await judged(core, engine, "숨은 새 벡터", place="p4")
    await add_vector(engine, hidden_target, TARGET, hidden=True)
    only_target = await judged(core, engine, "새 프로필만", place="p5", profile=TARGET)
    # Not live: a deleted note (its record lives on), a deleted record, a withdrawn member.
    deleted = await judged(core, engine, "지운 메모", place="p1")
    response = await core.client.delete(f"/api/v1/contexts/{deleted}", headers=bearer(1))
    assert response.status_code == 204
    record_gone, under_deleted_record = await created(core, "지운 기록", place="p6")
    await created(core, "지운 기록 둘", place="p6")
    response = await core.client.delete(f"/api/v1/records/{record_gone}", headers=bearer(1))
    assert response.status_code == 204
    _, withdrawn = await created(core, "탈퇴 회원", member=2, place="p7")
    assert (await core.client.delete("/api/v1/members/me", headers=bearer(2))).status_code == 204
    assert (await facts.state(engine, deleted)).statuses == ("CANCELLED", "CANCELLED")
    assert (await facts.state(engine, under_deleted_record)).statuses == ("CANCELLED", "CANCELLED")
    live = {only_in_use, both, pending, hidden_target, only_target}

    async with autocommit(engine) as conn:
        seeded_target = await embedding_switch.seed(
            conn, profile=TARGET, completed_only=False, generation=None
        )
        seeded_in_use = await embedding_switch.seed(
            conn, profile=PROFILE, completed_only=True, generation=None
        )
        again = await embedding_switch.seed(
            conn, profile=TARGET, completed_only=False, generation=None
        )
        covered = await embedding_switch.coverage(
            conn, profile=TARGET, in_use=PROFILE, window_seconds=60
        )

    assert set(await backfill_rows(engine, TARGET)) == {only_in_use, pending, hidden_target}
    assert seeded_target == 3 and again == 0
    # The profile in use: only completed embeddings lacking its vector (the pending note is
    # embedded by its own live stage).
    assert await backfill_rows(engine, PROFILE) == {only_target: ("PENDING", False)}
    assert seeded_in_use == 1
    assert len(live) == 5 and withdrawn not in live
    assert covered == embedding_switch.Coverage(
        total=5, done=2, missing_in_use=1, completed_recently=0
    )


async def test_coverage_counts_recent_completions_and_failures_by_reason(
    engine, core_with_fake_worker
):
    core = core_with_fake_worker
    ids = [await judged(core, engine, f"메모 {n}", place=f"p{n}") for n in range(6)]
    recent, earlier, too_long, unknown, failed_with_vector, still_open = ids
    deleted_failed = await judged(core, engine, "지운 실패", place="p0")
    async with autocommit(engine) as conn:
        assert (
            await embedding_switch.seed(conn, profile=TARGET, completed_only=False, generation=None)
            == 7
        )
    for context_id in (recent, earlier, failed_with_vector):
        await add_vector(engine, context_id, TARGET)
    await set_backfill(engine, TARGET, recent, status="COMPLETED")
    await set_backfill(engine, TARGET, earlier, status="COMPLETED", updated_at_ago=120)
    await set_backfill(engine, TARGET, too_long, status="FAILED", failure_reason="input_too_long")
    await set_backfill(engine, TARGET, unknown, status="FAILED")
    await set_backfill(engine, TARGET, failed_with_vector, status="FAILED", failure_reason="x")
    await set_backfill(engine, TARGET, deleted_failed, status="FAILED", failure_reason="gone")
    response = await core.client.delete(f"/api/v1/contexts/{deleted_failed}", headers=bearer(1))
    assert response.status_code == 204

    async with autocommit(engine) as conn:
        covered = await embedding_switch.coverage(
            conn, profile=TARGET, in_use=PROFILE, window_seconds=60
        )
        failed = await embedding_switch.failed_by_reason(conn, profile=TARGET)
        vectors = await embedding_switch.vectors_by_profile(conn)

    assert covered == embedding_switch.Coverage(
        total=6, done=3, missing_in_use=0, completed_recently=1
    )
    # A failure whose context got its vector after all is done, not failed; a deleted
    # context's failure counts nowhere.
    assert failed == {"input_too_long": 1, "unknown": 1}
    assert (await backfill_rows(engine, TARGET))[still_open] == ("PENDING", False)
    assert vectors == {PROFILE: (6, 1), TARGET: (3, 0)}


# --- proposals -------------------------------------------------------------------------------


async def _seeded(core, engine, count: int) -> list[int]:
    """``count`` live notes under the profile in use, each with an open backfill row of
    TARGET; their context ids, ascending."""
    ids = [await judged(core, engine, f"채울 메모 {n}", place=f"p{n}") for n in range(count)]
    async with autocommit(engine) as conn:
        assert (
            await embedding_switch.seed(conn, profile=TARGET, completed_only=False, generation=None)
            == count
        )
    return sorted(ids)


async def _propose(engine, limit: int, *, resend: float = RESEND, expiry: float = EXPIRY):
    async with autocommit(engine) as conn:
        return await embedding_switch.propose(
            conn,
            profile=TARGET,
            limit=limit,
            resend_seconds=resend,
            expiry_seconds=expiry,
            generation=None,
        )


async def test_proposals_come_in_id_order_and_are_marked_sent(engine, core_with_fake_worker):
    ids = await _seeded(core_with_fake_worker, engine, 6)

    first = await _propose(engine, 4)
    second = await _propose(engine, 4)
    third = await _propose(engine, 4)

    assert [s.context_id for s in first] == ids[:4]
    assert [s.context_id for s in second] == ids[4:]
    assert third == []
    context = await facts.context(engine, ids[0])
    assert first[0] == BackfillSource(ids[0], context.member_id, context.record_id, context.body)
    assert await backfill_rows(engine, TARGET) == {i: ("PENDING", True) for i in ids}
    # Another profile's rows are not this profile's proposals.
    async with autocommit(engine) as conn:
        other = await embedding_switch.propose(
            conn,
            profile=THIRD,
            limit=10,
            resend_seconds=RESEND,
            expiry_seconds=EXPIRY,
            generation=None,
        )
    assert other == []


async def test_rows_of_contexts_no_longer_live_are_closed_and_never_proposed(
    engine, core_with_fake_worker
):
    """Issue 28 #4, the core's side: a context deleted, replaced by an edit, its record
    deleted or its member withdrawn after its row was seeded is never sent to a worker (no
    provider call for it); its row ends CANCELLED so it is not looked at again."""
    core = core_with_fake_worker
    gone = {}
    for n, operation in enumerate(("delete_context", "modify_context", "delete_record")):
        record_id, context_id = await created(core, f"곧 사라질 메모 {n}", place=f"gone{n}")
        await make_judged(
            engine, context_id=context_id, user_id=1, record_id=record_id, profile=PROFILE
        )
        gone[operation] = (record_id, context_id)
    record_id, withdrawn = await created(core, "탈퇴할 회원의 메모", member=2, place="w")
    await make_judged(engine, context_id=withdrawn, user_id=2, record_id=record_id, profile=PROFILE)
    live = await judged(core, engine, "남는 메모", place="live")
    # A record keeps one active note at least: the deleted note's record has another.
    _, companion = await created(core, "같은 기록의 남는 메모", place="gone0")
    async with autocommit(engine) as conn:
        assert (
            await embedding_switch.seed(conn, profile=TARGET, completed_only=False, generation=None)
            == 6
        )
    for operation, (record_id, context_id) in gone.items():
        answer = await LIFECYCLE_OPERATIONS[operation](core.client, record_id, context_id)
        assert answer.status_code in (200, 204), answer.text
    assert (await core.client.delete("/api/v1/members/me", headers=bearer(2))).status_code == 204

    proposed = await _propose(engine, 10)

    assert [s.context_id for s in proposed] == sorted([live, companion])
    rows = await backfill_rows(engine, TARGET)
    assert (rows.pop(live), rows.pop(companion)) == (("PENDING", True), ("PENDING", True))
    assert rows == {
        context_id: ("CANCELLED", False)
        for context_id in (*(c for _, c in gone.values()), withdrawn)
    }
    assert await _propose(engine, 10, resend=0) == [*proposed]


async def test_unmarked_resend_due_and_expired_rows_are_proposed_again_once(
    engine, core_with_fake_worker
):
    ids = await _seeded(core_with_fake_worker, engine, 6)
    unmarked, resend_due, expired, held, done, failed = ids
    assert len(await _propose(engine, 10)) == 6
    long_ago = {"requested_at_ago": RESEND + 5}
    await set_backfill(engine, TARGET, resend_due, **long_ago)
    # Sent long ago and claimed by a worker that died: past the processing expiry.
    await set_backfill(
        engine, TARGET, expired, status="PROCESSING", updated_at_ago=EXPIRY + 5, **long_ago
    )
    # Claimed by a worker still within the expiry: its own, however long ago it was sent.
    await set_backfill(
        engine, TARGET, held, status="PROCESSING", updated_at_ago=EXPIRY - 60, **long_ago
    )
    await set_backfill(engine, TARGET, done, status="COMPLETED", **long_ago)
    await set_backfill(engine, TARGET, failed, status="FAILED", **long_ago)
    async with autocommit(engine) as conn:
        await embedding_switch.unmark(conn, profile=TARGET, context_ids=[unmarked])

    again = await _propose(engine, 10)
    right_after = await _propose(engine, 10)
    async with autocommit(engine) as conn:
        # No worker took them: sendable again at once, the claimed one only past its expiry.
        await embedding_switch.unmark(conn, profile=TARGET, context_ids=[expired, held])
    after_unmark = await _propose(engine, 10)

    assert [s.context_id for s in again] == [unmarked, resend_due, expired]
    # Marked sent, the reclaimed row too: two sends of one row never overlap.
    assert right_after == []
    assert [s.context_id for s in after_unmark] == [expired]
    rows = await backfill_rows(engine, TARGET)
    assert (rows[held], rows[expired]) == (("PROCESSING", False), ("PROCESSING", True))


async def test_concurrent_proposals_return_disjoint_rows(engine, core_with_fake_worker):
    """A proposal whose transaction is still open holds its rows: another process's proposal
    skips them at once instead of waiting, and neither sees the other's afterwards."""
    ids = await _seeded(core_with_fake_worker, engine, 7)
    async with engine.connect() as holding:
        await holding.begin()
        held = await embedding_switch.propose(
            holding,
            profile=TARGET,
            limit=3,
            resend_seconds=RESEND,
            expiry_seconds=EXPIRY,
            generation=None,
        )
        meanwhile = await asyncio.wait_for(_propose(engine, 3), 2)
        await holding.commit()
    rest = await _propose(engine, 10)
    after = await _propose(engine, 10)

    assert [s.context_id for s in held] == ids[:3]
    assert [s.context_id for s in meanwhile] == ids[3:6]
    assert [s.context_id for s in rest] == ids[6:]
    assert after == []


# --- the shared pace -------------------------------------------------------------------------

RATE = 40
MAX_BATCH = 4  # a slot every MAX_BATCH / RATE = 0.1 s
MEASURED_SECONDS = 3.0


async def _take_until(engine, deadline: float, grants: list[tuple[float, int]]) -> None:
    """Take slots as a replica's loop does, as often as possible, until ``deadline``."""
    while time.monotonic() < deadline:
        async with autocommit(engine) as conn:
            slot = await embedding_switch.take_batch_slot(conn, max_batch=MAX_BATCH)
        if slot is not None:
            grants.append((time.monotonic(), slot.batch))
        else:
            await asyncio.sleep(0.005)  # polling the shared row, as the loop does


async def test_two_replicas_together_take_rate_contexts_a_second(engine, migrated_database):
    replicas = [create_engine(migrated_database, pool_size=2) for _ in range(2)]
    try:
        async with autocommit(engine) as conn:
            await switch_start(conn, target=TARGET, rate=RATE)
        by_replica: list[list[tuple[float, int]]] = [[], []]
        deadline = time.monotonic() + MEASURED_SECONDS
        await asyncio.gather(
            *(
                _take_until(replica, deadline, grants)
                for replica, grants in zip(replicas, by_replica, strict=True)
                for _ in range(2)
            )
        )
    finally:
        for replica in replicas:
            await replica.dispose()

    assert all(by_replica)  # both replicas took slots
    grants = by_replica[0] + by_replica[1]
    assert {batch for _, batch in grants} == {MAX_BATCH}
    granted = sum(batch for _, batch in grants)
    # One slot is due at the start, then one every 0.1 s: RATE * 3 + one batch.
    expected = RATE * MEASURED_SECONDS + MAX_BATCH
    assert abs(granted - expected) <= 0.1 * expected, (granted, expected)


async def test_at_most_one_second_of_credit_is_saved_up(engine):
    async with autocommit(engine) as conn:
        await switch_start(conn, target=TARGET, rate=RATE)
        await conn.execute(
            text("UPDATE core.embedding_switch SET next_batch_at = now() - interval '1 hour'")
        )
    grants: list[tuple[float, int]] = []
    started = time.monotonic()
    await _take_until(engine, started + 0.5, grants)
    elapsed = time.monotonic() - started

    granted = sum(batch for _, batch in grants)
    # An idle hour is worth one second at most: RATE, plus the pace of the time measured.
    assert RATE <= granted <= RATE * (1 + elapsed) + 2 * MAX_BATCH, (granted, elapsed)


async def test_no_slot_while_idle_and_none_before_it_is_due(engine):
    async with autocommit(engine) as conn:
        assert await embedding_switch.take_batch_slot(conn, max_batch=64) is None
        assert await embedding_switch.seconds_until_slot(conn) is None
        await switch_start(conn, target=TARGET, rate=2)
        slot = await embedding_switch.take_batch_slot(conn, max_batch=64)
        refused = await embedding_switch.take_batch_slot(conn, max_batch=64)
        wait = await embedding_switch.seconds_until_slot(conn)
        await switch_roll_back(conn)
        after_rollback = await embedding_switch.take_batch_slot(conn, max_batch=64)

    assert slot is not None
    # a batch is the rate at most
    assert (slot.profile_in_use, slot.other_profile, slot.state, slot.batch) == (
        PROFILE,
        TARGET,
        "backfilling",
        2,
    )
    assert refused is None
    assert 0.9 < wait <= 1.0  # 2 contexts at 2 a second
    assert after_rollback is None


# --- judgments after a cutover ---------------------------------------------------------------


async def test_after_a_cutover_judgments_of_the_previous_profile_are_stale_and_reset(
    engine, core_with_fake_worker
):
    core = core_with_fake_worker
    previous = await judged(core, engine, "이전 프로필로 판정", place="p1")
    unrecorded = await judged(core, engine, "프로필 기록 없음", place="p2")
    current = await judged(core, engine, "새 프로필로 판정", place="p3")
    for context_id in (previous, unrecorded, current):
        await add_vector(engine, context_id, TARGET)
    async with autocommit(engine) as conn:
        await switch_start(conn, target=TARGET, rate=50)
        await embedding_switch.stamp_judgment_profile(conn, profile=PROFILE, batch=100)
        assert await switch_cut_over(conn)
    # What the judgments say after the cutover (NULL: one that escaped the stamping).
    async with engine.begin() as conn:
        for context_id, profile in ((previous, PROFILE), (unrecorded, None), (current, TARGET)):
            await conn.execute(
                text(
                    "UPDATE ai.context_keyword_analysis SET embedding_profile = :p "
                    "WHERE context_id = :id"
                ),
                {"p": profile, "id": context_id},
            )
    in_use = await read_profile_in_use(engine, configured=PROFILE)

    async with transaction(engine) as conn:
        stale = await keyword_reprocess.count_stale(conn, profile=in_use, version=1)
        selected = await keyword_reprocess.select_stale(
            conn, profile=in_use, version=1, after=0, limit=100
        )
        reset = await keyword_reprocess.reset_keyword_stages(
            conn, [previous, unrecorded, current], profile=in_use, version=1
        )

    assert in_use == TARGET
    # NULL: judged before the profile was recorded, so under the profile then in use: not
    # stale by profile (``reembed start`` stamps such rows before a switch).
    assert (stale, selected, reset) == (1, [previous], [previous])
    assert (await facts.state(engine, previous)).statuses == ("COMPLETED", "PENDING")
    for context_id in (unrecorded, current):
        assert (await facts.state(engine, context_id)).statuses == ("COMPLETED", "COMPLETED")
    # Under the profile before the cutover, the same list: nothing is stale but the
    # judgment made under the new profile.
    async with autocommit(engine) as conn:
        before = await keyword_reprocess.select_stale(
            conn, profile=PROFILE, version=1, after=0, limit=100
        )
    assert before == [current]


async def test_a_slot_taken_before_a_rollback_proposes_nothing_of_the_abandoned_target(
    engine, core_with_fake_worker
):
    """A pass takes its batch slot while the switch is backfilling; an operator's rollback
    commits before the pass proposes. The proposal, guarded by the slot's generation, sends
    nothing (no provider call for a switch that is over) and leaves the rows unmarked; a slot
    of the switch as it is now may propose the profile in use's rows only."""
    ids = await _seeded(core_with_fake_worker, engine, 3)
    async with autocommit(engine) as conn:
        await switch_start(conn, target=TARGET, rate=10)
        slot = await embedding_switch.take_batch_slot(conn, max_batch=64)
    async with autocommit(engine) as conn:
        assert (await switch_roll_back(conn)).state == "idle"
    async with autocommit(engine) as conn:
        stale = await embedding_switch.propose(
            conn,
            profile=TARGET,
            limit=10,
            resend_seconds=RESEND,
            expiry_seconds=EXPIRY,
            generation=slot.generation,
        )

    assert slot is not None and slot.other_profile == TARGET
    assert stale == []
    assert await backfill_rows(engine, TARGET) == {i: ("PENDING", False) for i in ids}
