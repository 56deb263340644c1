"""``pinlog-core reembed`` as operations (``core_service/operations/reembed.py``) and the core's
backfill loop (``core_service/service/reembed_backfill.py``); docs/operations.md "Switching
the embedding profile". Notes are saved through a real core app; the workers are real local
HTTP servers (``FakeWorker`` for readiness, ``ProfileWorker`` for the backfill route), read
and called over TCP."""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

import pytest
from prometheus_client import generate_latest
from sqlalchemy import text

from app.repository import profile_vectors
from app.repository.profile_vectors import BackfillAsk
from core_service.metrics import CoreMetrics
from core_service.operations import pause as dispatch_pause
from core_service.operations import reembed
from core_service.operations.reembed import ReembedRefused
from core_service.repository import embedding_switch
from core_service.repository.db import autocommit
from core_service.service.pause import PauseSwitch
from core_service.service.profile_in_use import CACHE_SECONDS, read_profile_in_use
from core_service.service.reembed_backfill import ReembedBackfill
from core_service.service.worker_readiness import ReadinessReader, WorkerReadiness
from pinlog_platform.contract.text_fingerprint import fingerprint
from tests.core import support as facts
from tests.core.harness import endpoints_of, profile_routing, profile_workers
from tests.core.support import (
    TARGET,
    THIRD,
    add_vector,
    backfill_rows,
    created,
    judged,
    switch_row,
)
from tests.worker.backfill_support import set_backfill
from tests.worker.harness import PROFILE, sample_value
from tests.worker.open_transactions import lock_waiters_reach
from tests.worker.support import make_preset, make_preset_vector

# The keys of ``reembed status --json``, in order (docs/operations.md, step 4).
STATUS_KEYS = [
    "profile_in_use",
    "target_profile",
    "previous_profile",
    "backfill_profile",
    "state",
    "total",
    "done",
    "failed",
    "missing_in_use",
    "rate_per_second",
    "configured_rate",
    "eta_seconds",
    "vectors",
    "previous_done",
    "via",
    "batches",
]


async def readings(*workers) -> list[WorkerReadiness]:
    reader = ReadinessReader([worker.base_url for worker in workers])
    try:
        return await reader.read_all()
    finally:
        await reader.aclose()


async def analysis_profiles(engine) -> dict[int, str | None]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT context_id, embedding_profile FROM ai.context_keyword_analysis")
        )
        return dict(rows.all())


async def start(engine, workers, *, target: str = TARGET, rate: int = 50):
    result = await reembed.start(
        engine, await readings(*workers), configured=PROFILE, target=target, rate=rate
    )
    assert not result.resumed
    return result.row


async def finish(engine, **kw):
    """``reembed.finish`` without the profile cache window (one test keeps it)."""
    return await reembed.finish(engine, window_seconds=0.0, **{"keep_old": False, **kw})


# --- start -----------------------------------------------------------------------------------


async def test_start_refuses_without_a_ready_worker_of_the_target_or_its_presets(
    engine, core_with_fake_worker, fake_worker
):
    context_id = await judged(core_with_fake_worker, engine, "판정된 메모", place="p1")
    async with profile_workers(TARGET) as (target_worker,):
        with pytest.raises(ReembedRefused, match="no listed worker serves profile") as no_worker:
            await start(engine, [fake_worker])
        fake_worker.profile, fake_worker.ready = TARGET, False
        with pytest.raises(ReembedRefused, match="no listed worker serves profile"):
            await start(engine, [fake_worker])
        fake_worker.profile, fake_worker.ready = PROFILE, True
        with pytest.raises(ReembedRefused, match="no preset is usable under profile"):
            await start(engine, [fake_worker, target_worker])
        with pytest.raises(ReembedRefused, match="already in use"):
            await start(engine, [fake_worker, target_worker], target=PROFILE)
        # Refused: nothing written, not even the stamps.
        assert await analysis_profiles(engine) == {context_id: None}
        assert await switch_row(engine) is None

        await make_preset(engine, preset_id=1, profile=TARGET)
        row = await start(engine, [fake_worker, target_worker])
        with pytest.raises(ReembedRefused, match="a switch is backfilling"):
            await start(engine, [fake_worker, target_worker], target=THIRD)

    assert no_worker.value.details == (
        f"{fake_worker.base_url}: profile {PROFILE}, list version 1, ready",
    )
    assert (row.state, row.profile_in_use, row.other_profile) == ("backfilling", PROFILE, TARGET)
    assert (await switch_row(engine)).other_profile == TARGET


async def test_start_stamps_unrecorded_judgments_and_proposes_every_live_context(
    engine, core_with_fake_worker
):
    core = core_with_fake_worker
    unrecorded = await judged(core, engine, "프로필 기록 없음", place="p1")
    recorded = await judged(core, engine, "기록된 판정", place="p2")
    _, pending = await created(core, "아직 임베딩 전", place="p3")
    only_target = await judged(core, engine, "새 프로필만", place="p4", profile=TARGET)
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE ai.context_keyword_analysis SET embedding_profile = :p "
                "WHERE context_id = ANY(CAST(:ids AS bigint[]))"
            ),
            {"p": THIRD, "ids": [recorded, only_target]},
        )
    await make_preset(engine, preset_id=1, profile=TARGET)

    async with profile_workers(TARGET) as workers:
        row = await start(engine, workers, rate=25)

    assert (row.state, row.rate_per_second) == ("backfilling", 25)
    # Judgments without a profile were made under the one in use; recorded ones keep theirs.
    assert await analysis_profiles(engine) == {
        unrecorded: PROFILE,
        recorded: THIRD,
        only_target: THIRD,
    }
    assert set(await backfill_rows(engine, TARGET)) == {unrecorded, recorded, pending}
    # The profile in use lacks the vector of a completed embedding made under the target.
    assert set(await backfill_rows(engine, PROFILE)) == {only_target}


async def test_two_starts_racing_get_one_switch_and_one_refusal(engine, core_with_fake_worker):
    """Both commands pass every check and queue behind an uncommitted switch row; the first
    to get it starts the switch, the other is refused by the statement's guard."""
    await judged(core_with_fake_worker, engine, "메모", place="p1")
    await make_preset(engine, preset_id=1, profile=TARGET)
    await make_preset_vector_of(engine, THIRD)
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO core.embedding_switch (id, profile_in_use, state) "
                "VALUES (1, :p, 'idle')"
            ),
            {"p": PROFILE},
        )
    async with profile_workers(TARGET, THIRD) as workers:
        ready = await readings(*workers)
        outcomes = await facts.racing_behind_the_switch_row(
            engine,
            [
                _outcome(reembed.start(engine, ready, configured=PROFILE, target=t, rate=9))
                for t in (TARGET, THIRD)
            ],
        )

    rows = [o.row for o in outcomes if not isinstance(o, ReembedRefused)]
    refusals = [o for o in outcomes if isinstance(o, ReembedRefused)]
    assert len(rows) == 1 and len(refusals) == 1
    assert "changed meanwhile" in str(refusals[0])
    assert await switch_row(engine) == rows[0]


async def make_preset_vector_of(engine, profile: str) -> None:
    """Preset 1 (made before) usable under ``profile`` too."""
    async with engine.begin() as conn:
        await make_preset_vector(conn, preset_id=1, profile=profile)


async def _outcome(call):
    try:
        return await call
    except ReembedRefused as refused:
        return refused


# --- status ----------------------------------------------------------------------------------


async def test_status_follows_the_switch_from_idle_to_ready_to_cut_over(
    engine, core_with_fake_worker
):
    core = core_with_fake_worker
    ids = [await judged(core, engine, f"메모 {n}", place=f"p{n}") for n in range(5)]
    recent, earlier, too_long, rejected, open_row = ids
    await make_preset(engine, preset_id=1, profile=TARGET)

    idle = (await reembed.status(engine, configured=PROFILE)).as_json()
    async with profile_workers(TARGET) as workers:
        await start(engine, workers, rate=20)
    started = (await reembed.status(engine, configured=PROFILE)).as_json()

    for context_id in (recent, earlier):
        await add_vector(engine, context_id, TARGET)
    await set_backfill(engine, TARGET, recent, status="COMPLETED")
    await set_backfill(engine, TARGET, earlier, status="COMPLETED", updated_at_ago=300)
    await set_backfill(engine, TARGET, too_long, status="FAILED", failure_reason="input_too_long")
    await set_backfill(engine, TARGET, rejected, status="FAILED", failure_reason="rejected")
    filling = (await reembed.status(engine, configured=PROFILE)).as_json()

    await add_vector(engine, open_row, TARGET)
    await set_backfill(engine, TARGET, open_row, status="COMPLETED")
    ready = await reembed.status(engine, configured=PROFILE)
    async with profile_workers(TARGET) as workers:
        await reembed.cut_over(engine, await readings(*workers), configured=PROFILE, force=False)
    cut_over = (await reembed.status(engine, configured=PROFILE)).as_json()

    for status in (idle, started, filling, ready.as_json(), cut_over):
        assert list(status) == STATUS_KEYS
    assert idle == {
        "profile_in_use": PROFILE, "target_profile": None, "previous_profile": None,
        "backfill_profile": None, "state": "idle", "total": 5, "done": 5, "failed": {},
        "missing_in_use": 0, "rate_per_second": 0.0, "configured_rate": None,
        "eta_seconds": 0.0, "vectors": {PROFILE: {"live": 5, "hidden": 0}},
        "previous_done": None, "via": "sync",
        "batches": {"submitted": 0, "in_progress": 0, "completed": 0, "failed": 0, "items": 0},
    }  # fmt: skip
    assert started == {
        **idle, "target_profile": TARGET, "backfill_profile": TARGET, "state": "backfilling",
        "done": 0, "configured_rate": 20, "eta_seconds": None,
    }  # fmt: skip
    # One completion within the minute: 1/60 a second; 1 context left at that pace.
    assert filling == {
        **started, "done": 2, "failed": {"input_too_long": 1, "rejected": 1},
        "rate_per_second": 0.02, "eta_seconds": 60.0,
        "vectors": {PROFILE: {"live": 5, "hidden": 0}, TARGET: {"live": 2, "hidden": 0}},
    }  # fmt: skip
    assert (ready.state, ready.done, ready.failed_total, ready.total) == ("ready", 3, 2, 5)
    assert ready.complete and ready.eta_seconds == 0.0
    # After the cutover the profile in use is measured (what `finish` needs complete); the
    # previous one, kept complete, is previous_done.
    assert cut_over == {
        **ready.as_json(), "profile_in_use": TARGET, "target_profile": TARGET,
        "previous_profile": PROFILE, "backfill_profile": TARGET, "state": "cut_over",
        "done": 3, "missing_in_use": 2, "previous_done": 5,
    }  # fmt: skip


# --- cutover, rollback, finish ---------------------------------------------------------------


async def _switched(core, engine, workers, count: int = 2, rate: int = 50) -> list[int]:
    """``count`` judged notes, the switch started to TARGET (presets loaded); their context
    ids, ascending."""
    ids = [await judged(core, engine, f"메모 {n}", place=f"p{n}") for n in range(count)]
    await make_preset(engine, preset_id=1, profile=TARGET)
    await start(engine, workers, rate=rate)
    return sorted(ids)


async def test_cutover_waits_for_the_backfill_unless_forced_and_for_a_ready_worker(
    engine, core_with_fake_worker, fake_worker
):
    async with profile_workers(TARGET) as workers:
        with pytest.raises(ReembedRefused, match="nothing to cut over: the switch is idle"):
            await reembed.cut_over(engine, await readings(*workers), configured=PROFILE, force=True)
        ids = await _switched(core_with_fake_worker, engine, workers)
        target_ready = await readings(*workers)
    with pytest.raises(ReembedRefused, match="backfill not complete: 0 of 2 done, 0 failed"):
        await reembed.cut_over(engine, target_ready, configured=PROFILE, force=False)
    await add_vector(engine, ids[0], TARGET)
    await set_backfill(engine, TARGET, ids[1], status="FAILED", failure_reason="input_too_long")
    with pytest.raises(ReembedRefused, match=f"no listed worker serves profile {TARGET}"):
        await reembed.cut_over(engine, await readings(fake_worker), configured=PROFILE, force=False)
    assert (await switch_row(engine)).state == "backfilling"

    row = await reembed.cut_over(engine, target_ready, configured=PROFILE, force=False)

    assert (row.state, row.profile_in_use, row.other_profile) == ("cut_over", TARGET, PROFILE)
    assert await read_profile_in_use(engine, configured=PROFILE) == TARGET


async def test_a_forced_cutover_before_the_backfill_is_done(engine, core_with_fake_worker):
    async with profile_workers(TARGET) as workers:
        await _switched(core_with_fake_worker, engine, workers)
        row = await reembed.cut_over(
            engine, await readings(*workers), configured=PROFILE, force=True
        )
    assert (row.state, row.profile_in_use) == ("cut_over", TARGET)


async def test_two_cutovers_racing_swap_the_profiles_once(engine, core_with_fake_worker):
    async with profile_workers(TARGET) as workers:
        await _switched(core_with_fake_worker, engine, workers)
        ready = await readings(*workers)
    outcomes = await facts.racing_behind_the_switch_row(
        engine,
        [
            _outcome(reembed.cut_over(engine, ready, configured=PROFILE, force=True))
            for _ in range(2)
        ],
    )

    refusals = [o for o in outcomes if isinstance(o, ReembedRefused)]
    assert len(refusals) == 1 and "changed meanwhile" in str(refusals[0])
    row = await switch_row(engine)
    assert (row.state, row.profile_in_use, row.other_profile) == ("cut_over", TARGET, PROFILE)


@pytest.mark.parametrize("cut_over_first", [False, True])
async def test_rollback_returns_to_the_profile_in_use_before_the_switch(
    engine, core_with_fake_worker, cut_over_first
):
    with pytest.raises(ReembedRefused, match="no switch to roll back"):
        await reembed.roll_back(engine)
    async with profile_workers(TARGET) as workers:
        await _switched(core_with_fake_worker, engine, workers)
        if cut_over_first:
            await reembed.cut_over(engine, await readings(*workers), configured=PROFILE, force=True)

    result = await reembed.roll_back(engine)

    row = result.row
    state = "rolling_back" if cut_over_first else "idle"
    assert (row.state, row.profile_in_use, row.other_profile) == (state, PROFILE, TARGET)
    assert not result.already
    assert await read_profile_in_use(engine, configured=PROFILE) == PROFILE
    status = await reembed.status(engine, configured=PROFILE)
    assert (status.state, status.target_profile, status.backfill_profile) == (
        (state, None, PROFILE if cut_over_first else None)
    )
    assert status.previous_profile == (TARGET if cut_over_first else None)
    if cut_over_first:
        again = await reembed.roll_back(engine)  # says so, changes nothing
        assert again.already and again.row == row
    else:
        with pytest.raises(ReembedRefused, match="no switch to roll back"):
            await reembed.roll_back(engine)


async def _vectors_everywhere(engine, ids: list[int]) -> None:
    """Each context with a vector and a completed backfill row of both profiles, and preset
    1 usable under both (plus a stray third profile's vector and preset vector)."""
    for context_id in ids:
        await add_vector(engine, context_id, TARGET)
    await add_vector(engine, ids[0], THIRD)
    async with engine.begin() as conn:
        await make_preset_vector(conn, preset_id=1, profile=PROFILE)
        await make_preset_vector(conn, preset_id=1, profile=THIRD)
        await conn.execute(
            text(
                "INSERT INTO ai.context_embedding_backfill (embedding_profile, context_id, "
                "status) SELECT CAST(:p AS varchar), context_id, 'COMPLETED' "
                "FROM ai.context_ai_state "
                "ON CONFLICT DO NOTHING"
            ),
            {"p": PROFILE},
        )
        await conn.execute(text("UPDATE ai.context_embedding_backfill SET status = 'COMPLETED'"))


async def _stored(engine) -> dict[str, tuple[int, int, int]]:
    """``{profile: (context vectors, backfill rows, preset vectors)}``."""
    counts: dict[str, list[int]] = {}
    async with engine.connect() as conn:
        for index, table in enumerate(
            ("ai.context_embedding", "ai.context_embedding_backfill",
             "ai.keyword_preset_embedding")
        ):  # fmt: skip
            rows = await conn.execute(
                text(f"SELECT embedding_profile, count(*) FROM {table} GROUP BY 1")
            )
            for profile, count in rows:
                counts.setdefault(profile, [0, 0, 0])[index] = count
    return {profile: tuple(values) for profile, values in counts.items()}


async def test_finish_removes_the_other_profiles_rows_after_a_cutover(
    engine, core_with_fake_worker
):
    async with profile_workers(TARGET) as workers:
        ids = await _switched(core_with_fake_worker, engine, workers, count=3)
        await _vectors_everywhere(engine, ids)
        with pytest.raises(ReembedRefused, match="the switch is backfilling"):
            await finish(engine)
        assert await _stored(engine) == {
            PROFILE: (3, 3, 1), TARGET: (3, 3, 1), THIRD: (1, 0, 1)
        }  # fmt: skip
        await reembed.cut_over(engine, await readings(*workers), configured=PROFILE, force=False)
    progress: list[int] = []

    row, removed = await finish(engine, on_progress=progress.append)

    assert (row.state, row.profile_in_use, row.other_profile) == ("idle", TARGET, None)
    assert await _stored(engine) == {TARGET: (3, 3, 1)}
    assert removed == 4 + 3 + 2 and progress == [removed]
    status = await reembed.status(engine, configured=PROFILE)
    assert (status.state, status.profile_in_use, status.done, status.total) == (
        "idle", TARGET, 3, 3,
    )  # fmt: skip


async def test_finish_keeping_the_old_profile_removes_nothing(engine, core_with_fake_worker):
    with pytest.raises(ReembedRefused, match="no switch to finish"):
        await finish(engine, keep_old=True)
    async with profile_workers(TARGET) as workers:
        ids = await _switched(core_with_fake_worker, engine, workers)
        await _vectors_everywhere(engine, ids)
    await reembed.roll_back(engine)
    before = await _stored(engine)

    row, removed = await finish(engine, keep_old=True)

    assert (row.state, row.profile_in_use, row.other_profile, removed) == (
        "idle", PROFILE, None, 0,
    )  # fmt: skip
    assert await _stored(engine) == before
    assert (await reembed.status(engine, configured=PROFILE)).vectors[TARGET]["live"] == 2


async def test_removal_runs_in_batches(engine, core_with_fake_worker):
    """``remove_other_profiles`` removes at most ``batch`` context vectors and ``batch``
    backfill rows a statement; repeated, it leaves only the profile in use."""
    async with profile_workers(TARGET) as workers:
        ids = await _switched(core_with_fake_worker, engine, workers, count=3)
        await _vectors_everywhere(engine, ids)
        await reembed.cut_over(engine, await readings(*workers), configured=PROFILE, force=False)
    row, _ = await finish(engine, keep_old=True)
    removed = []
    async with autocommit(engine) as conn:
        while batch := await embedding_switch.remove_other_profiles(
            conn, in_use=TARGET, generation=row.generation, batch=2
        ):
            removed.append(batch)
    # 4 vectors and 3 rows of other profiles, 2 preset vectors (all at once).
    assert removed == [2 + 2 + 2, 2 + 1]
    assert await _stored(engine) == {TARGET: (3, 3, 1)}


# --- the backfill loop -----------------------------------------------------------------------


@asynccontextmanager
async def backfill_loop(engine, workers):
    """A ``ReembedBackfill`` of one core process, its endpoints' profiles read once by the
    routing loop; the batches in flight are waited for on exit."""
    metrics = CoreMetrics()
    async with endpoints_of(*(w.base_url for w in workers)) as endpoints:
        async with profile_routing(endpoints) as routing:
            await routing.refresh_once()
        loop = ReembedBackfill(
            engine,
            endpoints,
            PauseSwitch(engine),
            metrics,
            configured_profile=PROFILE,
            resend_seconds=300,
            expiry_seconds=600,
        )
        yield loop, metrics
        await loop.drain()


def backfilled(metrics: CoreMetrics, result: str) -> float | None:
    exposition = generate_latest(metrics.registry).decode()
    return sample_value(exposition, "pinlog_core_backfill_contexts_total", result=result)


async def test_a_pass_sends_the_next_batch_to_a_worker_of_the_profile(
    engine, core_with_fake_worker
):
    async with profile_workers(PROFILE, TARGET) as (old, new):
        # 2 contexts a second: a batch is 2 contexts, one slot a second.
        ids = await _switched(core_with_fake_worker, engine, [new], count=3, rate=2)
        async with backfill_loop(engine, [old, new]) as (loop, metrics):
            assert await loop.pass_once() == 0.0
            await loop.drain()
            wait = await loop.pass_once()

    assert old.batches == []
    assert new.batched_context_ids() == [ids[:2]]
    notes = [await facts.context(engine, context_id) for context_id in ids[:2]]
    assert new.batches[0] == {
        "embeddingProfile": TARGET,
        "contexts": [
            {"contextId": context_id, "userId": note.member_id, "recordId": note.record_id,
             "text": note.body}
            for context_id, note in zip(ids[:2], notes, strict=True)
        ],
    }  # fmt: skip
    assert 0.2 < wait <= 1.0  # the next slot is due a second after the first
    assert backfilled(metrics, "completed") == 2
    assert await backfill_rows(engine, TARGET) == {
        ids[0]: ("PENDING", True), ids[1]: ("PENDING", True), ids[2]: ("PENDING", False),
    }  # fmt: skip


async def test_a_busy_worker_gets_the_rows_back_and_the_loop_waits(engine, core_with_fake_worker):
    async with profile_workers(TARGET) as (worker,):
        ids = await _switched(core_with_fake_worker, engine, [worker])
        worker.busy_retry_after = "7"
        async with backfill_loop(engine, [worker]) as (loop, metrics):
            assert await loop.pass_once() == 0.0
            await loop.drain()
            backoff = await loop.pass_once()

    assert worker.batched_context_ids() == [ids]  # sent once, not again while backing off
    assert 6.0 < backoff <= 7.0
    assert await backfill_rows(engine, TARGET) == {i: ("PENDING", False) for i in ids}
    assert backfilled(metrics, "refused") == 2


async def test_nothing_is_sent_while_dispatching_is_paused(engine, core_with_fake_worker):
    async with profile_workers(TARGET) as (worker,):
        ids = await _switched(core_with_fake_worker, engine, [worker])
        async with backfill_loop(engine, [worker]) as (loop, _):
            assert await dispatch_pause.change(engine, paused=True)
            paused_wait = await loop.pass_once()
            await loop.drain()
            sent_while_paused = list(worker.batches)
            rows_while_paused = await backfill_rows(engine, TARGET)
            async with autocommit(engine) as conn:
                slot_in = await embedding_switch.seconds_until_slot(conn)
            assert not await dispatch_pause.change(engine, paused=False)
            resumed = await loop.pass_once()

    assert paused_wait == 1.0
    assert sent_while_paused == []
    assert rows_while_paused == {i: ("PENDING", False) for i in ids}
    assert slot_in == 0  # no slot was taken while paused
    assert resumed == 0.0
    assert worker.batched_context_ids() == [ids]


# --- rolling back after a cutover (issue 28, row 1) --------------------------------------------


async def _backdate_switch(engine, seconds: float) -> None:
    """The switch last changed ``seconds`` earlier (the profile cache window has passed)."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE core.embedding_switch "
                "SET updated_at = updated_at - make_interval(secs => :s)"
            ),
            {"s": seconds},
        )


async def test_a_rollback_fills_what_cached_processes_embedded_under_the_abandoned_profile(
    engine, core_with_fake_worker
):
    """After a cutover and a rollback, a note embedded under the abandoned profile by a process
    still acting on its cached profile: the switch stays rolling_back, the loop proposes the
    restored profile only (nothing to the abandoned one's worker though its rows are open),
    and moves the switch to idle itself once the note has its vector and the cache window
    has passed; `start`, `cutover` and `finish` are refused meanwhile."""
    core = core_with_fake_worker
    async with profile_workers(PROFILE, TARGET) as (old, new):
        ids = await _switched(core, engine, [new], count=2, rate=10_000)
        for context_id in ids:
            await add_vector(engine, context_id, TARGET)
        await reembed.cut_over(engine, await readings(new), configured=PROFILE, force=False)
        rolled = await reembed.roll_back(engine)
        late = await judged(core, engine, "캐시된 프로필로 저장", place="late", profile=TARGET)
        async with backfill_loop(engine, [old, new]) as (loop, metrics):
            assert await loop.pass_once() == 0.5  # nothing open: seeds, not idle yet
            assert await loop.pass_once() == 0.0  # the seeded row goes to the old worker
            await loop.drain()
            await add_vector(engine, late, PROFILE)  # as that worker saves it
            await set_backfill(engine, PROFILE, late, status="COMPLETED")
            await loop.pass_once()
            within_window = await switch_row(engine)
            refusals = [
                await _outcome(start(engine, [old, new], target=THIRD)),
                await _outcome(reembed.cut_over(engine, await readings(new),
                                                configured=PROFILE, force=True)),
                await _outcome(finish(engine)),
            ]  # fmt: skip
            status = await reembed.status(engine, configured=PROFILE)
            await _backdate_switch(engine, 60)
            await loop.pass_once()
            loop._gauges_at = -1e9  # the next refresh is due now
            await loop._refresh_gauges()

    assert rolled.row.state == "rolling_back"
    assert old.batched_context_ids() == [[late]]
    assert new.batches == []  # its rows stay open: nothing spent on the abandoned profile
    assert set(await backfill_rows(engine, TARGET)) >= set(ids)
    assert within_window.state == "rolling_back"
    assert [type(r) for r in refusals] == [ReembedRefused] * 3
    assert "rollback is under way" in str(refusals[0])
    assert "rolling_back" in str(refusals[1]) and "rolling_back" in str(refusals[2])
    assert status.as_json() | {"vectors": None, "rate_per_second": None} == {
        **status.as_json(), "vectors": None, "rate_per_second": None,
        "state": "rolling_back", "profile_in_use": PROFILE, "target_profile": None,
        "previous_profile": TARGET, "backfill_profile": PROFILE, "total": 3, "done": 3,
        "previous_done": 3, "missing_in_use": 0,
    }  # fmt: skip
    row = await switch_row(engine)
    assert (row.state, row.profile_in_use, row.other_profile) == ("idle", PROFILE, TARGET)
    assert row.generation == within_window.generation + 1
    exposition = generate_latest(metrics.registry).decode()
    assert sample_value(exposition, "pinlog_core_reembed_state", state="idle") == 1
    assert sample_value(exposition, "pinlog_core_reembed_state", state="rolling_back") == 0


async def test_rolling_back_stays_until_every_completed_note_has_a_restored_vector(
    engine, core_with_fake_worker
):
    """The loop's move to idle is refused while a completed note lacks a vector of the
    restored profile (its backfill open), allowed once that backfill FAILED."""
    core = core_with_fake_worker
    async with profile_workers(TARGET) as (new,):
        ids = await _switched(core, engine, [new], count=1, rate=10_000)
        await add_vector(engine, ids[0], TARGET)
        await reembed.cut_over(engine, await readings(new), configured=PROFILE, force=False)
    await reembed.roll_back(engine)
    late = await judged(core, engine, "캐시된 프로필로 저장", place="late", profile=TARGET)
    await _backdate_switch(engine, 60)
    moves = []
    async with autocommit(engine) as conn:
        await embedding_switch.seed(conn, profile=PROFILE, completed_only=True, generation=None)
        for status in ("PENDING", "FAILED"):
            await set_backfill(engine, PROFILE, late, status=status, failure_reason="rejected")
            row = await embedding_switch.read(conn)
            moves.append(
                await embedding_switch.move_to_idle(
                    conn, generation=row.generation, in_use=PROFILE, window_seconds=5
                )
            )

    assert moves[0] is None
    assert moves[1] is not None and moves[1].state == "idle"


async def test_start_again_finishes_what_a_stopped_start_left(engine, core_with_fake_worker):
    """A `reembed start` stopped after its move (judgments not stamped, nothing proposed):
    the same start again stamps and proposes and says it resumed; the cutover refuses
    while judgments are unstamped."""
    core = core_with_fake_worker
    ids = [await judged(core, engine, f"메모 {n}", place=f"p{n}") for n in range(2)]
    await make_preset(engine, preset_id=1, profile=TARGET)
    async with autocommit(engine) as conn:
        await facts.switch_start(conn, target=TARGET, rate=30)  # the move alone
    async with profile_workers(TARGET) as workers:
        ready = await readings(*workers)
        with pytest.raises(ReembedRefused, match="judgments without their profile"):
            await reembed.cut_over(engine, ready, configured=PROFILE, force=True)
        before = await switch_row(engine)
        result = await reembed.start(engine, ready, configured=PROFILE, target=TARGET, rate=50)

    assert result.resumed and result.row == before  # the switch itself is unchanged
    assert await analysis_profiles(engine) == {i: PROFILE for i in ids}
    assert set(await backfill_rows(engine, TARGET)) == set(ids)


async def test_a_start_resumed_while_the_switch_is_rolled_back_proposes_nothing(
    engine, core_with_fake_worker
):
    """A `reembed start` run again while its switch is backfilling (to finish what a stopped
    run left) reads the switch, then stamps and proposes. An operator's rollback that commits
    in between (the resumed start held behind a judgment another transaction locks) leaves
    the switch idle: the start must not propose rows of the abandoned target afterwards
    (PENDING rows no loop ever sends, of a switch that is over) and says the switch changed."""
    core = core_with_fake_worker
    ids = [await judged(core, engine, f"메모 {n}", place=f"p{n}") for n in range(2)]
    await make_preset(engine, preset_id=1, profile=TARGET)
    async with autocommit(engine) as conn:
        await facts.switch_start(conn, target=TARGET, rate=30)  # the move alone
    async with profile_workers(TARGET) as workers:
        ready = await readings(*workers)
        async with engine.connect() as holder:
            held = await holder.begin()
            await holder.execute(
                text(
                    "SELECT context_id FROM ai.context_keyword_analysis "
                    "WHERE embedding_profile IS NULL FOR UPDATE"
                )
            )
            task = asyncio.create_task(
                reembed.start(engine, ready, configured=PROFILE, target=TARGET, rate=50)
            )
            await lock_waiters_reach(engine, 1)  # the resumed start stamps, behind the lock
            async with autocommit(engine) as conn:
                assert (await facts.switch_roll_back(conn)).state == "idle"
            await held.rollback()
        outcome = await _outcome(task)

    assert isinstance(outcome, ReembedRefused) and "changed meanwhile" in str(outcome)
    assert (await switch_row(engine)).state == "idle"
    assert await backfill_rows(engine, TARGET) == {}
    assert await analysis_profiles(engine) == {i: PROFILE for i in ids}


async def test_a_note_whose_state_row_predates_the_cores_digest_is_claimable_by_the_backfill(
    engine, core_with_fake_worker, stage_pool
):
    """A state row written before the core recorded the owner and the digest of its text
    (0006, 0020: a deployment's notes from before them) cannot be claimed by the backfill
    route, which trusts only the core's digest and owner: proposed again every resend delay,
    forever, the switch never ready. `reembed start` (and the loop's seeding) write them as a
    create does, from the note the core holds, so the worker's real claim takes it."""
    core = core_with_fake_worker
    legacy = await judged(core, engine, "오래된 메모", place="p1")
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE ai.context_ai_state SET user_id = NULL, record_id = NULL, "
                "text_sha256_from_core = false WHERE context_id = :id"
            ),
            {"id": legacy},
        )
    await make_preset(engine, preset_id=1, profile=TARGET)
    async with profile_workers(TARGET) as workers:
        await start(engine, workers)
    note = await facts.context(engine, legacy)
    async with autocommit(engine) as conn:
        sources = await embedding_switch.propose(
            conn, profile=TARGET, limit=10, resend_seconds=300, expiry_seconds=600, generation=None
        )
    claims = await profile_vectors.claim(
        stage_pool,
        embedding_profile=TARGET,
        asks=[BackfillAsk(legacy, fingerprint(note.body), note.member_id, note.record_id)],
        expiry_seconds=600,
    )

    assert [source.context_id for source in sources] == [legacy]
    assert [(c.context_id, c.user_id, c.record_id) for c in claims] == [
        (legacy, note.member_id, note.record_id)
    ]


# --- finish (issue 28, row 2) -------------------------------------------------------------------


async def test_finish_after_a_forced_cutover_refuses_while_notes_lack_the_profile_in_use(
    engine, core_with_fake_worker
):
    """Issue 28's instance: 30 notes, a forced cutover with 7 backfilled; status measures the
    profile in use (7 of 30, the previous 30), finish is refused saying 23 are left and
    removes nothing; once they are all there it finishes."""
    core = core_with_fake_worker
    async with profile_workers(TARGET) as workers:
        ids = await _switched(core, engine, workers, count=30)
        for context_id in ids[:7]:
            await add_vector(engine, context_id, TARGET)
            await set_backfill(engine, TARGET, context_id, status="COMPLETED")
        await reembed.cut_over(engine, await readings(*workers), configured=PROFILE, force=True)
    status = await reembed.status(engine, configured=PROFILE)
    with pytest.raises(ReembedRefused, match="23 live note") as refused:
        await finish(engine)
    stored = await _stored(engine)
    await add_vector(engine, ids[7], TARGET)
    await set_backfill(engine, TARGET, ids[7], status="COMPLETED")
    for context_id in ids[8:]:
        await set_backfill(engine, TARGET, context_id, status="FAILED", failure_reason="rejected")
    with pytest.raises(ReembedRefused, match="22 of them failed") as failed:
        await finish(engine)
    row, removed = await finish(engine, force=True)

    assert (status.state, status.backfill_profile, status.done, status.total) == (
        "cut_over", TARGET, 7, 30,
    )  # fmt: skip
    assert (status.missing_in_use, status.previous_done) == (23, 30)
    assert "backfill row(s) of it open" in str(refused.value)
    assert stored[PROFILE][0] == 30  # nothing removed
    assert failed.value.details == (f"failed backfills of {TARGET}: rejected=22",)
    assert row.state == "idle" and removed == 8  # the old vectors of notes with a new one
    vectors = await facts.vector_profiles(engine, ids)
    assert [vectors[i] for i in ids] == [[TARGET]] * 8 + [[PROFILE]] * 22  # none left bare


async def _backfilled(engine, ids: list[int]) -> None:
    """Each context with a vector of TARGET and its backfill row COMPLETED, as a worker of
    TARGET leaves them."""
    for context_id in ids:
        await add_vector(engine, context_id, TARGET)
        await set_backfill(engine, TARGET, context_id, status="COMPLETED")


async def test_finish_waits_for_the_profile_cache_window_since_the_last_move(
    engine, core_with_fake_worker
):
    async with profile_workers(TARGET) as workers:
        ids = await _switched(core_with_fake_worker, engine, workers)
        await _backfilled(engine, ids)
        await reembed.cut_over(engine, await readings(*workers), configured=PROFILE, force=False)
    told: list[float] = []

    row, _ = await reembed.finish(engine, keep_old=True, on_waiting=told.append)

    assert len(told) == 1 and 0 < told[0] <= CACHE_SECONDS
    assert row.state == "idle"


async def test_two_finishes_racing_have_one_winner(engine, core_with_fake_worker):
    async with profile_workers(TARGET) as workers:
        ids = await _switched(core_with_fake_worker, engine, workers)
        await _backfilled(engine, ids)
        await reembed.cut_over(engine, await readings(*workers), configured=PROFILE, force=False)
    outcomes = await facts.racing_behind_the_switch_row(
        engine, [_outcome(finish(engine, keep_old=True)) for _ in range(2)]
    )

    refusals = [o for o in outcomes if isinstance(o, ReembedRefused)]
    assert len(refusals) == 1 and "changed meanwhile" in str(refusals[0])
    assert (await switch_row(engine)).state == "idle"
