"""``pinlog-core reembed start --via batch`` (docs/operations.md "Backfill via the Batch API"):
the core marks the rows, its backfill loop sends them with ``"via": "batch"`` to a real worker
whose provider is the fake OpenAI server's Batch API; held rows are never proposed again,
cutover counts them as open, a rollback has the workers cancel the abandoned profile's batches,
rows proposed after the start go the synchronous way, and ``reembed status`` / ``status`` count
the batches. The core never calls the provider (§0): only the worker does.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager

import pytest
from sqlalchemy import text

from core_service.metrics import CoreMetrics
from core_service.operations import pause as dispatch_pause
from core_service.operations import reembed
from core_service.operations.reembed import ReembedRefused
from core_service.repository import embedding_switch
from core_service.service.pause import PauseSwitch
from core_service.service.reembed_backfill import ReembedBackfill
from core_service.service.status import read_status
from core_service.service.switch_status import read_switch_status
from core_service.service.worker_readiness import ReadinessReader, WorkerReadiness
from tests.core.harness import endpoints_of, profile_routing
from tests.core.support import TARGET, judged, switch_row
from tests.e2e.processes import core_environment, run_command
from tests.worker.harness import PROFILE

BATCH_SETTINGS = {"embedding_batch_api": True, "batch_poll_seconds": 0.05}
WAIT_SECONDS = 20.0


@pytest.fixture
async def notes_core(make_core, fake_worker):
    """A core whose configured profile is TARGET (notes are judged under it); the switch goes
    to PROFILE, the real worker's."""
    async with make_core(fake_worker.base_url, embedding_profile=TARGET) as core:
        yield core


async def notes(core, engine, count: int) -> list[int]:
    return sorted(
        [
            await judged(core, engine, f"배치 메모 {n}", place=f"b{n}", profile=TARGET)
            for n in range(count)
        ]
    )


@asynccontextmanager
async def backfill_loop(engine, worker):
    """The backfill loop of one core process, sending to ``worker`` (its profile read)."""
    async with endpoints_of(str(worker.client.base_url)) as endpoints:
        async with profile_routing(endpoints) as routing:
            await routing.refresh_once()
        yield ReembedBackfill(
            engine,
            endpoints,
            PauseSwitch(engine),
            CoreMetrics(),
            configured_profile=TARGET,
            resend_seconds=600,
            expiry_seconds=600,
        )


async def rows(engine) -> dict[int, tuple[str, bool, str | None]]:
    """``{context_id: (status, via_batch, batch_id)}`` of PROFILE's backfill rows."""
    async with engine.connect() as conn:
        result = await conn.execute(
            text(
                "SELECT context_id, status, via_batch, batch_id FROM "
                "ai.context_embedding_backfill WHERE embedding_profile = :p"
            ),
            {"p": PROFILE},
        )
        return {r.context_id: (r.status, r.via_batch, r.batch_id) for r in result}


async def until(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not await condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


async def readings(worker) -> list[WorkerReadiness]:
    reader = ReadinessReader([str(worker.client.base_url)])
    try:
        return await reader.read_all()
    finally:
        await reader.aclose()


async def start_by_batch(engine, worker) -> None:
    await reembed.start(
        engine, await readings(worker), configured=TARGET, target=PROFILE, rate=50, via="batch"
    )


async def _start_command(migrated_database, worker, *args: str) -> tuple[int, str, str]:
    env = core_environment(migrated_database, str(worker.client.base_url), embedding_profile=TARGET)
    return await run_command(
        "core_service.cli", "reembed", "start", "--profile", PROFILE, "--via", "batch", *args,
        env=env,
    )  # fmt: skip


async def test_start_via_batch_is_refused_while_a_worker_of_the_profile_takes_no_batches(
    engine, notes_core, make_worker, migrated_database
):
    await notes(notes_core, engine, 1)
    async with make_worker(embedding_batch_api=False) as worker:
        url = str(worker.client.base_url)
        with pytest.raises(ReembedRefused, match="report no Batch API") as refused:
            await start_by_batch(engine, worker)
        assert refused.value.details == (url,)
        code, out, err = await _start_command(migrated_database, worker)
    assert code == 1, (out, err)
    assert "report no Batch API" in err and url in err
    assert await switch_row(engine) is None  # nothing started


async def test_start_via_batch_prints_the_first_batch_and_with_wait_its_results(
    engine, notes_core, make_worker, migrated_database, fake_openai
):
    ids = await notes(notes_core, engine, 2)
    async with make_worker(**BATCH_SETTINGS) as worker:
        code, out, err = await _start_command(migrated_database, worker, "--wait")
    (batch_id,) = fake_openai.batches.batch_ids
    assert code == 0, (out, err)
    assert f"first batch {batch_id} submitted" in out and "reembed status" in out
    assert '"completed": 1' in out  # --wait: the batch's results saved
    assert {i: r[0] for i, r in (await rows(engine)).items()} == dict.fromkeys(ids, "COMPLETED")


async def test_marked_rows_go_in_one_batch_held_until_saved_and_are_never_proposed_again(
    engine, notes_core, make_worker, fake_openai
):
    ids = await notes(notes_core, engine, 3)
    async with make_worker(**BATCH_SETTINGS) as worker, backfill_loop(engine, worker) as loop:
        await start_by_batch(engine, worker)
        assert (await switch_row(engine)).via == "batch"
        assert await rows(engine) == {i: ("PENDING", True, None) for i in ids}
        fake_openai.batches.hold_batches(True)

        assert await loop.send_by_batch()
        (batch_id,) = fake_openai.batches.batch_ids
        assert await rows(engine) == {i: ("PROCESSING", True, batch_id) for i in ids}
        # Held rows past the resend delay and the processing expiry: proposed neither way.
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "UPDATE ai.context_embedding_backfill SET requested_at = now() - interval "
                    "'1 day', updated_at = now() - interval '1 day'"
                )
            )
        for via_batch in (True, False):
            async with engine.connect() as conn:
                assert not await embedding_switch.propose(
                    conn, profile=PROFILE, limit=10, resend_seconds=1, expiry_seconds=1,
                    generation=None, via_batch=via_batch,
                )  # fmt: skip
        assert not await loop.send_by_batch()
        status = await read_switch_status(engine, configured=TARGET)
        assert status.batches == {
            "submitted": 1, "in_progress": 1, "completed": 0, "failed": 0, "items": 3,
        }  # fmt: skip
        # Cutover counts held rows as open.
        with pytest.raises(ReembedRefused, match="backfill not complete"):
            await reembed.cut_over(engine, await readings(worker), configured=TARGET, force=False)

        fake_openai.batches.hold_batches(False)

        async def saved() -> bool:
            return all(r[0] == "COMPLETED" for r in (await rows(engine)).values())

        await until(saved, "batch results not saved")
        assert fake_openai.embedding_calls == 0
    done = await read_switch_status(engine, configured=TARGET)
    assert done.as_json()["batches"] == {
        "submitted": 1, "in_progress": 0, "completed": 1, "failed": 0, "items": 0,
    }  # fmt: skip
    assert done.done == 3 and done.as_json()["via"] == "batch"
    report = await read_status(engine, processing_expiry_seconds=600, analyser_version="x")
    assert report.as_json()["batches"]["completed"] == 1


async def test_rows_proposed_after_the_start_go_the_synchronous_way(
    engine, notes_core, make_worker
):
    first = await notes(notes_core, engine, 1)
    async with make_worker(**BATCH_SETTINGS) as worker:
        await start_by_batch(engine, worker)
        later = await judged(notes_core, engine, "나중 메모", place="later", profile=TARGET)
        row = await switch_row(engine)
        async with engine.begin() as conn:
            await embedding_switch.seed(
                conn, profile=PROFILE, completed_only=False, generation=row.generation
            )
        marked = await rows(engine)
        async with engine.begin() as conn:
            sync = await embedding_switch.propose(
                conn, profile=PROFILE, limit=10, resend_seconds=600, expiry_seconds=600,
                generation=row.generation,
            )  # fmt: skip
    assert marked == {first[0]: ("PENDING", True, None), later: ("PENDING", False, None)}
    assert [s.context_id for s in sync] == [later]


async def test_a_rollback_has_the_workers_cancel_the_batches_and_discard_their_results(
    engine, notes_core, make_worker, fake_openai
):
    ids = await notes(notes_core, engine, 2)
    async with make_worker(**BATCH_SETTINGS) as worker, backfill_loop(engine, worker) as loop:
        await start_by_batch(engine, worker)
        fake_openai.batches.hold_batches(True)
        assert await loop.send_by_batch()
        (batch_id,) = fake_openai.batches.batch_ids
        result = await reembed.roll_back(engine)
        assert result.row.state == "idle"

        async def cancelled() -> bool:
            return fake_openai.batches.batch(batch_id)["status"] == "cancelled"

        await until(cancelled, "batch not cancelled")

        async def returned() -> bool:
            return all(r[2] is None for r in (await rows(engine)).values())

        await until(returned, "rows still held")
    assert await rows(engine) == {i: ("PENDING", False, None) for i in ids}
    async with engine.connect() as conn:
        stored = await conn.execute(
            text("SELECT count(*) FROM ai.context_embedding WHERE embedding_profile = :p"),
            {"p": PROFILE},
        )
        assert stored.scalar_one() == 0


async def test_nothing_is_sent_by_batch_while_dispatching_is_paused(
    engine, notes_core, make_worker, fake_openai
):
    ids = await notes(notes_core, engine, 2)
    async with make_worker(**BATCH_SETTINGS) as worker, backfill_loop(engine, worker) as loop:
        await start_by_batch(engine, worker)
        await dispatch_pause.change(engine, paused=True)
        assert not await loop.send_by_batch()
        assert fake_openai.batches.batch_ids == []
        assert await rows(engine) == {i: ("PENDING", True, None) for i in ids}


async def test_a_start_run_again_must_name_the_via_the_switch_was_started_with(
    engine, notes_core, make_worker
):
    await notes(notes_core, engine, 1)
    async with make_worker(**BATCH_SETTINGS) as worker:
        await start_by_batch(engine, worker)
        with pytest.raises(ReembedRefused, match="was started --via batch"):
            await reembed.start(
                engine, await readings(worker), configured=TARGET, target=PROFILE, rate=50
            )
        again = await reembed.start(
            engine, await readings(worker), configured=TARGET, target=PROFILE, rate=50,
            via="batch",
        )  # fmt: skip
    assert again.resumed and again.row.via == "batch"


async def test_finish_after_a_forced_cutover_waits_for_the_rows_a_batch_holds(
    engine, notes_core, make_worker, fake_openai
):
    await notes(notes_core, engine, 2)
    async with make_worker(**BATCH_SETTINGS) as worker, backfill_loop(engine, worker) as loop:
        await start_by_batch(engine, worker)
        fake_openai.batches.hold_batches(True)
        assert await loop.send_by_batch()
        await reembed.cut_over(engine, await readings(worker), configured=TARGET, force=True)
        with pytest.raises(ReembedRefused, match=r"2 backfill row\(s\) of it open"):
            await reembed.finish(engine, keep_old=True, force=True, window_seconds=0.0)
    assert (await switch_row(engine)).state == "cut_over"


async def test_marked_rows_go_the_synchronous_way_once_no_worker_takes_batches(
    engine, notes_core, make_worker, fake_openai
):
    """Rows marked while the workers took batches, sent after every worker of the profile was
    reconfigured without (``"batch": false``): the worker refuses them (409) and they go the
    synchronous way, sendable at once, instead of being resent after every backoff for ever."""
    ids = await notes(notes_core, engine, 2)
    async with make_worker(**BATCH_SETTINGS) as worker:
        await start_by_batch(engine, worker)
    assert await rows(engine) == {i: ("PENDING", True, None) for i in ids}
    async with (
        make_worker(embedding_batch_api=False) as worker,
        backfill_loop(engine, worker) as loop,
    ):
        assert await loop.send_by_batch()
    assert await rows(engine) == {i: ("PENDING", False, None) for i in ids}
    assert fake_openai.batches.batch_ids == []
