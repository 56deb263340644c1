"""``pinlog-core reprocess keywords --via batch`` (docs/operations.md "Reprocess via the Batch
API"): the reset marks the keyword stages, the rescan and the finalizer leave marked stages
alone (held by a batch or still to send), two core processes never propose one stage at once,
the command is refused (exit 1, naming the workers, nothing reset) while a worker reports no
Batch API for its judge or dispatching is paused, and otherwise prints the first batch and,
with ``--wait-results``, its results, saved without a synchronous judge call. The core never
calls the provider (§0): only the worker does.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text

from core_service.composition import open_operations
from core_service.metrics import CoreMetrics
from core_service.operations import pause as dispatch_pause
from core_service.operations.batch_waits import BatchesStillOpen, wait_until_settled
from core_service.operations.keyword_reprocess import (
    BatchRefused,
    Via,
    reprocess,
    results_wait_spelling,
)
from core_service.repository import context_ai_state, keyword_batches
from core_service.repository.context_ai_state import Expiries
from core_service.service.pause import PauseSwitch
from core_service.service.reembed_backfill import ReembedBackfill
from core_service.service.status import read_status
from tests.core import support as facts
from tests.core.harness import core_settings, endpoints_of, profile_routing
from tests.e2e.observe import wait_until
from tests.e2e.processes import core_environment, run_command
from tests.worker.harness import PROFILE

KEYWORD_BATCH_SETTINGS = {
    "judge_batch_api": True,
    "batch_poll_seconds": 0.05,
    "keyword_similarity_floor": -1.0,
    "presets_refresh_seconds": 0.2,
}
MAX_RETRY = 3
EXPIRIES = Expiries(pending_seconds=60, processing_seconds=60)


async def notes(core, engine, count: int) -> list[int]:
    return [
        await facts.judged(core, engine, f"키워드 배치 메모 {n}", place=f"k{n}")
        for n in range(count)
    ]


# A new revision of every preset with its vector (what `presets load` of a changed list
# leaves): the list version of PROFILE goes from 1 to 2.
NEW_LIST_REVISION = (
    text("UPDATE ai.keyword_preset SET version = version + 1"),
    text(
        "UPDATE ai.keyword_preset_embedding SET preset_version = preset_version + 1 "
        "WHERE embedding_profile = :p"
    ),
)


async def stale_note(engine, core) -> int:
    """A note the real worker judged with list 1, the list then at 2."""
    response = await core.create(1, "창가 자리 조용하고 콘센트 많은 카페", place="kb-1")
    context_id = response.json()["contextId"]

    async def judged() -> bool:
        return (await keyword_states(engine)).get(context_id, ("",))[0] == "COMPLETED"

    await wait_until(judged, what="the note judged with the first list")
    async with engine.begin() as conn:
        for statement in NEW_LIST_REVISION:
            await conn.execute(statement, {"p": PROFILE})
    return context_id


SET_STATE = text(
    "UPDATE ai.context_ai_state SET keyword_status = :status, retry_count = :retries, "
    "keyword_via_batch = :via_batch, keyword_batch_id = :batch_id, "
    "updated_at = now() - interval '1 day', rescanned_at = NULL, next_dispatch_at = NULL "
    "WHERE context_id = :id"
)


async def set_state(
    engine,
    context_id: int,
    *,
    status: str = "PENDING",
    retries: int = 0,
    via_batch: bool = False,
    batch_id: str | None = None,
) -> None:
    """A keyword stage as given, its progress clock a day ago (stale by every expiry)."""
    params = {"id": context_id, "status": status, "retries": retries,
              "via_batch": via_batch, "batch_id": batch_id}  # fmt: skip
    async with engine.begin() as conn:
        await conn.execute(SET_STATE, params)


async def keyword_states(engine) -> dict[int, tuple[str, int, bool]]:
    """``{context_id: (keyword_status, retry_count, keyword_via_batch)}``."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT context_id, keyword_status, retry_count, keyword_via_batch "
                 "FROM ai.context_ai_state")
        )  # fmt: skip
        return {r.context_id: (r.keyword_status, r.retry_count, r.keyword_via_batch) for r in rows}


async def test_the_rescan_and_the_finalizer_leave_marked_keyword_stages_alone(
    engine, core_with_fake_worker
):
    held, unsent, exhausted, stale = await notes(core_with_fake_worker, engine, 4)
    await set_state(engine, held, status="PROCESSING", retries=MAX_RETRY, via_batch=True,
                    batch_id="batch_held")  # fmt: skip
    await set_state(engine, unsent, retries=MAX_RETRY, via_batch=True)
    await set_state(engine, exhausted, status="PROCESSING", retries=MAX_RETRY)
    await set_state(engine, stale)

    async with engine.begin() as conn:
        finalized = await context_ai_state.finalize_exhausted(
            conn, expiries=EXPIRIES, max_retry=MAX_RETRY, batch_size=100
        )
        claimed = await context_ai_state.claim_stale(
            conn, expiries=EXPIRIES, max_retry=MAX_RETRY, batch_size=100
        )

    assert finalized == [exhausted]
    assert [context_id for context_id, _ in claimed] == [stale]
    after = await keyword_states(engine)
    assert after[held] == ("PROCESSING", MAX_RETRY, True)
    assert after[unsent] == ("PENDING", MAX_RETRY, True)
    # A batch that returns the stage clears its mark: the normal path takes it again.
    await set_state(engine, held, status="PROCESSING")
    async with engine.begin() as conn:
        claimed = await context_ai_state.claim_stale(
            conn, expiries=EXPIRIES, max_retry=MAX_RETRY, batch_size=100
        )
    assert [context_id for context_id, _ in claimed] == [held]


async def test_two_core_processes_never_propose_the_same_marked_stage(
    engine, core_with_fake_worker
):
    ids = await notes(core_with_fake_worker, engine, 4)
    for context_id in ids[:3]:
        await set_state(engine, context_id, via_batch=True)
    # Held by a batch already: never proposed.
    await set_state(engine, ids[3], status="PROCESSING", via_batch=True, batch_id="batch_other")
    params = {"resend_seconds": 600.0, "expiry_seconds": 600.0}
    async with engine.connect() as first, engine.connect() as second:
        await first.begin()
        mine = await keyword_batches.propose(first, limit=2, **params)
        # The second process skips the rows the first has locked, uncommitted.
        theirs = await keyword_batches.propose(second, limit=10, **params)
        await second.commit()
        await first.commit()
        # Both stamped as sent: nothing again before the resend delay.
        assert await keyword_batches.propose(second, limit=10, **params) == []
    assert [s.context_id for s in mine] == ids[:2]
    assert [s.context_id for s in theirs] == [ids[2]]
    assert mine[0].body == "키워드 배치 메모 0"


async def _reprocess(migrated_database, worker, *args: str) -> tuple[int, str, str]:
    env = core_environment(migrated_database, str(worker.client.base_url))
    return await run_command(
        "core_service.cli", "reprocess", "keywords", "--via", "batch", "--wait", "30", *args,
        env=env,
    )  # fmt: skip


async def test_reprocess_via_batch_is_refused_while_a_worker_takes_no_batches_for_its_judge(
    engine, make_worker, make_core, migrated_database
):
    async with make_worker(
        judge_batch_api=False, presets_refresh_seconds=0.2, keyword_similarity_floor=-1.0
    ) as worker:
        async with make_core(str(worker.client.base_url)) as core:
            context_id = await stale_note(engine, core)
        code, out, err = await _reprocess(migrated_database, worker)
    assert code == 1, (out, err)
    assert "report no Batch API for their judge" in err
    assert str(worker.client.base_url).rstrip("/") in err
    assert (await keyword_states(engine))[context_id][0::2] == ("COMPLETED", False)


async def test_reprocess_via_batch_is_refused_while_dispatching_is_paused(
    engine, make_worker, make_core, migrated_database
):
    async with make_worker(**KEYWORD_BATCH_SETTINGS) as worker:
        url = str(worker.client.base_url)
        async with make_core(url) as core:
            context_id = await stale_note(engine, core)
        await dispatch_pause.change(engine, paused=True)
        try:
            async with open_operations(core_settings(migrated_database, url)) as operations:
                with pytest.raises(BatchRefused, match="dispatching is paused"):
                    await reprocess(operations, rate=50, wait=30, via=Via.BATCH)
        finally:
            await dispatch_pause.change(engine, paused=False)
    assert (await keyword_states(engine))[context_id][0::2] == ("COMPLETED", False)


async def test_reprocess_via_batch_prints_the_first_batch_and_with_wait_results_its_results(
    engine, make_worker, make_core, migrated_database, fake_openai
):
    async with make_worker(**KEYWORD_BATCH_SETTINGS) as worker:
        async with make_core(str(worker.client.base_url)) as core:
            context_id = await stale_note(engine, core)
        judged_before = fake_openai.judge_calls
        retries_before = (await keyword_states(engine))[context_id][1]
        # A bare --wait (as reembed start --via batch --wait) waits for the results.
        code, out, err = await _reprocess(migrated_database, worker, "--wait")
    (batch_id,) = fake_openai.batches.batch_ids
    assert code == 0, (out, err)
    assert f"first batch {batch_id} submitted" in out and "status --json" in out
    assert '"completed": 1' in out  # the results waited for: the batch's results saved
    assert fake_openai.judge_calls == judged_before  # no synchronous judge request
    assert (await keyword_states(engine))[context_id][0] == "COMPLETED"
    preset_version = await facts.count(
        engine,
        "SELECT preset_version FROM ai.context_keyword_analysis WHERE context_id = :id",
        id=context_id,
    )
    assert preset_version == 2
    async with engine.connect() as conn:
        kind = await conn.execute(
            text("SELECT kind FROM ai.provider_batch WHERE batch_id = :b"), {"b": batch_id}
        )
        assert kind.scalar_one() == "keyword"
    assert PROFILE in out
    # `status --json` counts the keyword batches with the backfill's.
    report = await read_status(engine, processing_expiry_seconds=600, analyser_version="x")
    assert report.as_json()["batches"] == {
        "submitted": 1, "in_progress": 0, "completed": 1, "failed": 0, "items": 0,
    }  # fmt: skip
    # No retry spent on the way (the batch path never counts a dispatch).
    assert (await keyword_states(engine))[context_id][1] == retries_before


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (["reprocess", "keywords", "--via", "batch", "--wait"], "--wait-results"),
        (["reprocess", "keywords", "--wait", "--via", "batch"], "--wait-results"),
        (["reprocess", "keywords", "--wait", "30"], "--wait"),
        (["reembed", "start", "--via", "batch", "--wait"], "--wait"),
    ],
)
def test_a_bare_wait_of_reprocess_keywords_waits_for_the_results(arguments, expected):
    """``--wait`` with no number is the results' wait (the spelling of ``reembed start``);
    ``--wait SECONDS`` keeps its meaning, and no other command's ``--wait`` changes."""
    assert results_wait_spelling(arguments) == [
        expected if argument == "--wait" else argument for argument in arguments
    ]


async def test_marked_stages_go_the_synchronous_way_once_no_worker_takes_batches(
    engine, make_worker, make_core
):
    """A stage marked while the workers took batches, sent after every worker was
    reconfigured without (``"keywordBatch": false``): refused (409), it goes the synchronous
    way instead of being resent after every backoff for ever."""
    async with make_worker(
        judge_batch_api=False, presets_refresh_seconds=0.2, keyword_similarity_floor=-1.0
    ) as worker:
        async with make_core(str(worker.client.base_url)) as core:
            context_id = await stale_note(engine, core)
        await set_state(engine, context_id, via_batch=True)
        async with endpoints_of(str(worker.client.base_url)) as endpoints:
            async with profile_routing(endpoints) as routing:
                await routing.refresh_once()
            loop = ReembedBackfill(
                engine, endpoints, PauseSwitch(engine), CoreMetrics(),
                configured_profile=PROFILE, resend_seconds=600, expiry_seconds=600,
            )  # fmt: skip
            assert await loop.send_keywords_by_batch()
    assert (await keyword_states(engine))[context_id] == ("PENDING", 0, False)


async def test_a_wait_for_results_that_runs_out_with_work_open_is_an_error(
    engine, core_with_fake_worker
):
    """``--wait``'s wait ending with a marked stage still open raises ``BatchesStillOpen`` (the
    command exits 1); with nothing open it returns the batches' counts."""
    (context_id,) = await notes(core_with_fake_worker, engine, 1)
    await set_state(engine, context_id, via_batch=True)
    with pytest.raises(BatchesStillOpen, match="1 context"):
        await wait_until_settled(
            engine, profile=PROFILE, kind="keyword", open_work=keyword_batches.open_via_batch,
            on_progress=lambda *_: None, wait_seconds=0,
        )  # fmt: skip
    await set_state(engine, context_id, status="COMPLETED")
    ended = await wait_until_settled(
        engine, profile=PROFILE, kind="keyword", open_work=keyword_batches.open_via_batch,
        on_progress=lambda *_: None, wait_seconds=0,
    )  # fmt: skip
    assert ended.in_progress == 0
