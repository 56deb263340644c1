"""A keyword reprocess by the judge's Batch API (``app.service.keyword_batches``) over real
HTTP, the provider being the fake OpenAI server's Batch API (``tests/fake_openai_batches.py``):
submit, hold, poll, save through the synchronous path's fenced save; a context deleted while
its batch runs (the core's delete in an open transaction the save waits for), held stages
never reclaimed after the processing expiry, an expired batch and an invalid judgment back to
the synchronous path (once), per-item errors that fail only the note's own fault, a cancelled
batch discarded, and ``/readyz``'s ``keywordBatch``.
"""

from __future__ import annotations

import httpx
import orjson
from sqlalchemy import text

from app.providers.openai_compatible import JUDGE_SYSTEM_PROMPT
from tests.fake_openai import error_body, judge_body
from tests.worker.api.test_backfill_route import NOTES
from tests.worker.harness import PROFILE, SECRET, RunningWorker
from tests.worker.open_transactions import (
    cancel_context,
    cancelled_in_open_transaction,
    lock_waiters_reach,
)
from tests.worker.provider_batch_support import (
    ask_cancelled,
    in_progress,
    polled_as,
    post_batch,
    settled,
)
from tests.worker.support import backdate, keyword_rows, make_embedding, make_state, vector

PATH = "/internal/v1/batch/keywords"
# Every preset is a candidate (floor -1): each note's judgment is asked of the provider.
KEYWORD_BATCH_SETTINGS = {
    "judge_batch_api": True,
    "batch_poll_seconds": 0.05,
    "keyword_similarity_floor": -1.0,
}


def note(context_id: int) -> dict:
    return {
        "contextId": context_id,
        "userId": context_id,
        "recordId": 10 * context_id,
        "text": NOTES[context_id],
    }


async def marked(engine, context_id: int) -> None:
    """A context the core reset for a reprocess by batch: embedded under PROFILE, keyword
    stage PENDING and marked, the core's digest and owner on its state row."""
    await make_state(
        engine, context_id=context_id, embedding_status="COMPLETED",
        user_id=context_id, record_id=10 * context_id, core_text=NOTES[context_id],
    )  # fmt: skip
    await make_embedding(
        engine, context_id=context_id, user_id=context_id, record_id=10 * context_id,
        embedding=vector(f"note {context_id}"), profile=PROFILE,
    )  # fmt: skip
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE ai.context_ai_state SET keyword_via_batch = true WHERE context_id = :i"),
            {"i": context_id},
        )


async def submit(worker: RunningWorker, ids: list[int]) -> dict:
    return await post_batch(
        worker, PATH, {"embeddingProfile": PROFILE, "contexts": [note(i) for i in ids]}
    )


async def stages(engine) -> dict[int, tuple[str, str | None, bool]]:
    """``{context_id: (keyword_status, keyword_batch_id, keyword_via_batch)}``."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT context_id, keyword_status, keyword_batch_id, keyword_via_batch "
                "FROM ai.context_ai_state"
            )
        )
        return {r.context_id: (r.keyword_status, r.keyword_batch_id, r.keyword_via_batch)
                for r in rows}  # fmt: skip


async def analysis(engine, context_id: int) -> tuple[list, str] | None:
    """The stored candidates and model profile of a context's judgment."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT candidates, model_profile FROM ai.context_keyword_analysis "
                    "WHERE context_id = :i"
                ),
                {"i": context_id},
            )
        ).one_or_none()
    return None if row is None else (row.candidates, row.model_profile)


async def test_marked_stages_are_judged_by_one_batch_and_saved_without_a_synchronous_call(
    engine, make_worker, fake_openai
):
    for context_id in (1, 2, 3):
        await marked(engine, context_id)
    async with make_worker(**KEYWORD_BATCH_SETTINGS) as worker:
        fake_openai.batches.hold_batches(True)
        answer = await submit(worker, [1, 2, 3])
        batch_id = answer["batchId"]
        assert answer == {
            "batchId": batch_id, "batched": 3, "completed": 0, "failed": 0, "notClaimed": 0,
        }  # fmt: skip
        await polled_as(fake_openai, batch_id, "in_progress")
        assert await stages(engine) == dict.fromkeys((1, 2, 3), ("PROCESSING", batch_id, True))
        # Each line is the synchronous judge's request: its prompt and a candidate enum.
        batch = fake_openai.batches.batch(batch_id)
        assert batch["endpoint"] == "/v1/chat/completions"
        async with httpx.AsyncClient(base_url=fake_openai.base_url + "/", timeout=5) as p:
            content = (await p.get(f"files/{batch['input_file_id']}/content")).content
        lines = [orjson.loads(line) for line in content.splitlines()]
        assert [line["custom_id"] for line in lines] == ["1:1", "2:1", "3:1"]
        first = lines[0]["body"]
        assert first["messages"][0]["content"] == JUDGE_SYSTEM_PROMPT
        schema = first["response_format"]["json_schema"]["schema"]
        enum = schema["properties"]["selected"]["items"]["properties"]["keywordId"]["enum"]
        fake_openai.batches.hold_batches(False)
        record = await settled(engine, batch_id)
        await worker.app.state.usage.flush()
        async with engine.connect() as conn:
            ledger = (
                await conn.execute(
                    text(
                        "SELECT prompt_tokens, completion_tokens, estimated_tokens "
                        "FROM ai.provider_usage_daily "
                        "WHERE stage = 'keyword_batch'"
                    )
                )
            ).one()

    assert record["status"] == "completed" and record["kind"] == "keyword"
    # Settled: the ledger holds what the results report (the estimate at submission taken
    # back where it counted more), nothing left estimated.
    assert record["settled_tokens"] > 0
    assert ledger.prompt_tokens + ledger.completion_tokens == record["settled_tokens"]
    assert ledger.estimated_tokens == 0
    assert {cid: row[0] for cid, row in (await stages(engine)).items()} == dict.fromkeys(
        (1, 2, 3), "COMPLETED"
    )
    # The fake selects the first candidate; the candidates asked are stored with the save.
    candidates, model_profile = await analysis(engine, 1)
    assert [c[0] for c in candidates] == enum
    assert set(await keyword_rows(engine, 1)) == {enum[0]}
    assert model_profile == worker.settings.judge_profile
    assert fake_openai.judge_calls == 0  # not one synchronous judge request
    async with engine.connect() as conn:
        items = await conn.execute(text("SELECT count(*) FROM ai.keyword_batch_item"))
        assert items.scalar_one() == 0  # forgotten once settled


async def test_a_context_deleted_while_its_batch_runs_gets_no_keywords(
    engine, make_worker, fake_openai
):
    """The core's delete holds the state row when the result arrives: the save waits for it
    and, the delete committed, writes nothing (CANCELLED wins); the other note is saved."""
    for context_id in (1, 2):
        await marked(engine, context_id)
    async with make_worker(**KEYWORD_BATCH_SETTINGS) as worker:
        batch_id = await in_progress(fake_openai, submit(worker, [1, 2]))
        async with cancelled_in_open_transaction(engine, 1) as delete:
            fake_openai.batches.hold_batches(False)
            await lock_waiters_reach(engine, 1)  # the save, behind the open delete
            await delete.commit()
        record = await settled(engine, batch_id)

    assert record["status"] == "completed"
    assert (await stages(engine))[1][0] == "CANCELLED"
    assert await keyword_rows(engine, 1) == {} and await analysis(engine, 1) is None
    assert (await stages(engine))[2][0] == "COMPLETED"


async def test_held_stages_are_not_reclaimed_after_the_processing_expiry(
    engine, make_worker, fake_openai
):
    await marked(engine, 1)
    async with make_worker(**KEYWORD_BATCH_SETTINGS) as worker:
        fake_openai.batches.hold_batches(True)
        batch_id = (await submit(worker, [1]))["batchId"]
        await backdate(engine, 1, seconds=86_400)
        # The synchronous path's request and a second batch request claim nothing.
        await worker.process(1, NOTES[1], user_id=1, record_id=10)
        assert (await submit(worker, [1]))["notClaimed"] == 1
        assert (await stages(engine))[1] == ("PROCESSING", batch_id, True)
        fake_openai.batches.hold_batches(False)
        await settled(engine, batch_id)
    assert fake_openai.judge_calls == 0
    assert (await stages(engine))[1][0] == "COMPLETED"


async def test_an_expired_batch_returns_what_it_did_not_answer_to_the_synchronous_path(
    engine, make_worker, fake_openai
):
    for context_id in (1, 2, 3):
        await marked(engine, context_id)
    async with make_worker(**KEYWORD_BATCH_SETTINGS) as worker:
        batch_id = await in_progress(fake_openai, submit(worker, [1, 2, 3]))
        fake_openai.batches.expire_batch(batch_id, completed=1)
        record = await settled(engine, batch_id)
        after = await stages(engine)
        # Unfinished: no batch, no mark, never FAILED; the synchronous claim takes it over
        # after the processing expiry, as after a transient fault.
        await backdate(engine, 2, seconds=86_400)
        await worker.process(2, NOTES[2], user_id=2, record_id=20)

    assert record["status"] == "expired"
    assert after[1][0] == "COMPLETED"
    assert after[2] == after[3] == ("PROCESSING", None, False)
    assert fake_openai.judge_calls == 1
    assert (await stages(engine))[2][0] == "COMPLETED"


async def test_an_invalid_judgment_goes_back_to_the_synchronous_path_once(
    engine, make_worker, fake_openai
):
    for context_id in (1, 2):
        await marked(engine, context_id)
    fake_openai.batches.fail_custom_ids({"1:1": (200, judge_body([], raw_content="no json"))})
    async with make_worker(**KEYWORD_BATCH_SETTINGS) as worker:
        batch_id = (await submit(worker, [1, 2]))["batchId"]
        await settled(engine, batch_id)
        assert (await stages(engine))[1] == ("PROCESSING", None, False)
        # Unmarked: a later batch request does not take it again.
        await backdate(engine, 1, seconds=86_400)
        assert (await submit(worker, [1]))["notClaimed"] == 1
        await worker.process(1, NOTES[1], user_id=1, record_id=10)

    assert fake_openai.judge_calls == 1  # the synchronous judge, once
    assert {cid: row[0] for cid, row in (await stages(engine)).items()} == {
        1: "COMPLETED", 2: "COMPLETED",
    }  # fmt: skip


async def failure_of(engine, context_id: int) -> str | None:
    async with engine.connect() as conn:
        return (
            await conn.execute(
                text("SELECT keyword_failure FROM ai.context_ai_state WHERE context_id = :i"),
                {"i": context_id},
            )
        ).scalar_one()


async def test_per_item_errors_fail_only_the_notes_own_fault(engine, make_worker, fake_openai):
    """A provider-wide error (authentication, quota) of one item returns it to the synchronous
    path; a message the provider refuses as the note's own ends that stage FAILED."""
    for context_id in (1, 2, 3, 4):
        await marked(engine, context_id)
    fake_openai.batches.fail_custom_ids({
        "1:1": (401, error_body("bad key", type="invalid_request_error",
                                code="invalid_api_key")),
        "2:1": (429, error_body("quota", type="insufficient_quota", code="insufficient_quota")),
        "3:1": (400, error_body("bad input", param="messages")),
    })  # fmt: skip
    async with make_worker(**KEYWORD_BATCH_SETTINGS) as worker:
        batch_id = (await submit(worker, [1, 2, 3, 4]))["batchId"]
        await settled(engine, batch_id)

    after = await stages(engine)
    assert after[1] == after[2] == ("PROCESSING", None, False)
    assert after[3][0] == "FAILED" and await failure_of(engine, 3) == "input_rejected"
    assert after[4][0] == "COMPLETED"
    assert await failure_of(engine, 1) is None and await failure_of(engine, 2) is None


async def test_a_batch_the_core_asked_cancelled_is_cancelled_and_its_results_discarded(
    engine, make_worker, fake_openai
):
    await marked(engine, 1)
    async with make_worker(**KEYWORD_BATCH_SETTINGS) as worker:
        batch_id = await in_progress(fake_openai, submit(worker, [1]))
        await ask_cancelled(engine, batch_id)
        record = await settled(engine, batch_id)
    assert fake_openai.batches.batch(batch_id)["status"] == "cancelled"
    assert record["status"] == "cancelled"
    assert (await stages(engine))[1] == ("PROCESSING", None, False)
    assert await keyword_rows(engine, 1) == {}


async def test_a_deleted_context_is_not_claimed_and_unmarked_stages_are_not_taken(
    engine, make_worker, fake_openai
):
    for context_id in (1, 2):
        await marked(engine, context_id)
    await cancel_context(engine, context_id=1)
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE ai.context_ai_state SET keyword_via_batch = false WHERE context_id = 2")
        )
    async with make_worker(**KEYWORD_BATCH_SETTINGS) as worker:
        answer = await submit(worker, [1, 2])
    assert answer == {
        "batchId": None, "batched": 0, "completed": 0, "failed": 0, "notClaimed": 2,
    }  # fmt: skip
    assert fake_openai.batches.batch_ids == []


async def test_readyz_reports_whether_the_judge_takes_batches(make_worker):
    async with make_worker(**KEYWORD_BATCH_SETTINGS) as worker:
        assert (await worker.client.get("/readyz")).json()["keywordBatch"] is True
    async with make_worker(judge_batch_api=False) as worker:
        assert (await worker.client.get("/readyz")).json()["keywordBatch"] is False
        body = {"embeddingProfile": PROFILE, "contexts": [note(1)]}
        refused = await worker.client.post(PATH, json=body, headers={"X-Internal-Secret": SECRET})
        assert refused.status_code == 409
    async with make_worker(judge_batch_api=True, judge_votes=3) as worker:
        assert (await worker.client.get("/readyz")).json()["keywordBatch"] is False


async def test_a_stopped_workers_keyword_batch_is_settled_by_the_next_worker(
    engine, make_worker, fake_openai
):
    for context_id in (1, 2):
        await marked(engine, context_id)
    fake_openai.batches.hold_batches(True)
    async with make_worker(**KEYWORD_BATCH_SETTINGS) as first:
        batch_id = (await submit(first, [1, 2]))["batchId"]
        await polled_as(fake_openai, batch_id, "in_progress")
    # The first worker is gone with its batch open; the stages stay held.
    assert await stages(engine) == dict.fromkeys((1, 2), ("PROCESSING", batch_id, True))
    fake_openai.batches.hold_batches(False)
    async with make_worker(**KEYWORD_BATCH_SETTINGS):
        record = await settled(engine, batch_id)
    assert record["status"] == "completed"
    assert {cid: row[0] for cid, row in (await stages(engine)).items()} == dict.fromkeys(
        (1, 2), "COMPLETED"
    )
