"""The re-embedding backfill by the provider's Batch API (``app.service.batch_backfill``) over
real HTTP, the provider being the fake OpenAI server's Batch API
(``tests/fake_openai_batches.py``): submit, hold, poll, settle; expiry, cancel, per-item
errors, a context deleted while its batch runs, a worker stopped and another resuming its
batch, and held rows never reclaimed after the processing expiry.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from sqlalchemy import text

from app.providers.hashing import hash_embed
from tests.fake_openai import error_body
from tests.worker.api.test_backfill_route import (
    DIMENSION,
    NOTES,
    context,
    embedded_under_the_old_profile,
)
from tests.worker.backfill_support import (
    BACKFILL_PATH,
    backfill_row,
    post_backfill,
    vectors_by_profile,
)
from tests.worker.backfill_support import BackfillRow as Row
from tests.worker.backfill_support import backfill_counts as counts
from tests.worker.harness import PROFILE, SECRET, RunningWorker
from tests.worker.open_transactions import cancel_context
from tests.worker.provider_batch_support import (
    ask_cancelled,
    batch_record,
    in_progress,
    polled_as,
    post_batch,
    settled,
)

BATCH_SETTINGS = {"embedding_batch_api": True, "batch_poll_seconds": 0.05}


async def submit(worker: RunningWorker, ids: list[int]) -> dict:
    body = {
        "embeddingProfile": PROFILE,
        "contexts": [context(i) for i in ids],
        "via": "batch",
    }
    return await post_batch(worker, BACKFILL_PATH, body)


async def held_rows(engine) -> dict[int, tuple[str, str | None, bool]]:
    """``{context_id: (status, batch_id, via_batch)}`` of the backfill rows of PROFILE."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT context_id, status, batch_id, via_batch FROM "
                "ai.context_embedding_backfill WHERE embedding_profile = :p"
            ),
            {"p": PROFILE},
        )
        return {r.context_id: (r.status, r.batch_id, r.via_batch) for r in rows}


def assert_stored(vectors: dict, context_id: int) -> None:
    assert vectors[PROFILE].shape == (DIMENSION,)
    np.testing.assert_allclose(
        vectors[PROFILE], hash_embed(NOTES[context_id], DIMENSION), atol=1e-6
    )


async def test_a_batch_is_submitted_held_polled_and_saved_without_a_synchronous_call(
    engine, make_worker, fake_openai
):
    for context_id in (1, 2, 3):
        await embedded_under_the_old_profile(engine, context_id)
    async with make_worker(**BATCH_SETTINGS) as worker:
        fake_openai.batches.hold_batches(True)
        answer = await submit(worker, [1, 2, 3])
        batch_id = answer["batchId"]
        assert answer == {"batchId": batch_id, "batched": 3, "failed": 0, "notClaimed": 0}
        await polled_as(fake_openai, batch_id, "in_progress")
        assert {cid: row[:2] for cid, row in (await held_rows(engine)).items()} == {
            cid: ("PROCESSING", batch_id) for cid in (1, 2, 3)
        }
        fake_openai.batches.hold_batches(False)
        record = await settled(engine, batch_id)

    assert record["status"] == "completed" and record["items"] == 3
    assert record["settled_tokens"] > 0 and record["estimated_tokens"] > 0
    # The notes' texts and vectors are deleted at the provider once saved.
    batch = fake_openai.batches.batch(batch_id)
    async with httpx.AsyncClient(base_url=fake_openai.base_url + "/", timeout=5) as provider:
        for file_id in (batch["input_file_id"], batch["output_file_id"]):
            assert (await provider.get(f"files/{file_id}")).status_code == 404
    for context_id in (1, 2, 3):
        assert await backfill_row(engine, context_id, PROFILE) == Row("COMPLETED", 1, None)
        assert_stored(await vectors_by_profile(engine, context_id), context_id)
    assert fake_openai.embedding_calls == 0  # not one synchronous embedding request


async def test_an_expired_batch_saves_what_it_answered_and_returns_the_rest_to_sync(
    engine, make_worker, fake_openai
):
    for context_id in (1, 2, 3):
        await embedded_under_the_old_profile(engine, context_id)
    async with make_worker(**BATCH_SETTINGS) as worker:
        batch_id = await in_progress(fake_openai, submit(worker, [1, 2, 3]))
        fake_openai.batches.expire_batch(batch_id, completed=1)
        record = await settled(engine, batch_id)

    assert record["status"] == "expired"
    rows = await held_rows(engine)
    assert rows[1] == ("COMPLETED", batch_id, False)
    # Unfinished: PENDING, no batch, on the synchronous path (never FAILED).
    assert rows[2] == rows[3] == ("PENDING", None, False)


async def test_per_item_errors_fail_only_the_notes_own_fault(engine, make_worker, fake_openai):
    """A provider-wide error (authentication, quota, a 5xx) of one item returns it to the
    synchronous path; an input the provider refuses ends that row FAILED with its reason."""
    for context_id in (1, 2, 3, 4):
        await embedded_under_the_old_profile(engine, context_id)
    fake_openai.batches.fail_custom_ids({
        "1:1:1:10": (401, error_body("bad key", type="invalid_request_error",
                                     code="invalid_api_key")),
        "2:1:2:20": (429, error_body("quota", type="insufficient_quota",
                                     code="insufficient_quota")),
        "3:1:3:30": (400, error_body("bad input", param="input")),
    })  # fmt: skip
    async with make_worker(**BATCH_SETTINGS) as worker:
        batch_id = (await submit(worker, [1, 2, 3, 4]))["batchId"]
        await settled(engine, batch_id)

    rows = await held_rows(engine)
    assert rows[1] == rows[2] == ("PENDING", None, False)
    assert await backfill_row(engine, 3, PROFILE) == Row("FAILED", 1, "input_rejected")
    assert rows[4][0] == "COMPLETED"


async def test_a_context_deleted_while_its_batch_runs_gets_no_vector(
    engine, make_worker, fake_openai
):
    for context_id in (1, 2):
        await embedded_under_the_old_profile(engine, context_id)
    async with make_worker(**BATCH_SETTINGS) as worker:
        batch_id = await in_progress(fake_openai, submit(worker, [1, 2]))
        await cancel_context(engine, context_id=1)
        fake_openai.batches.hold_batches(False)
        await settled(engine, batch_id)

    assert await backfill_row(engine, 1, PROFILE) == Row("CANCELLED", 1, None)
    assert PROFILE not in await vectors_by_profile(engine, 1)
    assert_stored(await vectors_by_profile(engine, 2), 2)


async def test_held_rows_are_not_reclaimed_after_the_processing_expiry(
    engine, make_worker, fake_openai
):
    await embedded_under_the_old_profile(engine, 1)
    async with make_worker(**BATCH_SETTINGS) as worker:
        fake_openai.batches.hold_batches(True)
        batch_id = (await submit(worker, [1]))["batchId"]
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "UPDATE ai.context_embedding_backfill SET updated_at = now() - "
                    "interval '1 day' WHERE context_id = 1"
                )
            )
        again = await post_backfill(worker, [context(1)])
        assert again.json() == counts(not_claimed=1)
        fake_openai.batches.hold_batches(False)
        await settled(engine, batch_id)
    assert fake_openai.embedding_calls == 0
    assert await backfill_row(engine, 1, PROFILE) == Row("COMPLETED", 1, None)


async def test_a_stopped_workers_batch_is_settled_by_the_next_worker(
    engine, make_worker, fake_openai
):
    for context_id in (1, 2):
        await embedded_under_the_old_profile(engine, context_id)
    fake_openai.batches.hold_batches(True)
    async with make_worker(**BATCH_SETTINGS) as first:
        batch_id = (await submit(first, [1, 2]))["batchId"]
        await polled_as(fake_openai, batch_id, "in_progress")
    # The first worker is gone with its batch open; the rows stay held.
    assert {cid: row[:2] for cid, row in (await held_rows(engine)).items()} == {
        1: ("PROCESSING", batch_id),
        2: ("PROCESSING", batch_id),
    }
    fake_openai.batches.hold_batches(False)
    async with make_worker(**BATCH_SETTINGS):
        record = await settled(engine, batch_id)
    assert record["status"] == "completed"
    for context_id in (1, 2):
        assert_stored(await vectors_by_profile(engine, context_id), context_id)


async def test_a_batch_the_core_asked_cancelled_is_cancelled_and_its_results_discarded(
    engine, make_worker, fake_openai
):
    for context_id in (1, 2):
        await embedded_under_the_old_profile(engine, context_id)
    async with make_worker(**BATCH_SETTINGS) as worker:
        batch_id = await in_progress(fake_openai, submit(worker, [1, 2]))
        await ask_cancelled(engine, batch_id)
        record = await settled(engine, batch_id)

    assert fake_openai.batches.batch(batch_id)["status"] == "cancelled"
    assert record["status"] == "cancelled"
    for context_id in (1, 2):
        assert PROFILE not in await vectors_by_profile(engine, context_id)
        assert (await held_rows(engine))[context_id] == ("PENDING", None, False)


async def test_readyz_reports_whether_the_provider_takes_batches(make_worker):
    async with make_worker(**BATCH_SETTINGS) as worker:
        assert (await worker.client.get("/readyz")).json()["batch"] is True
    async with make_worker(embedding_batch_api=False) as worker:
        assert (await worker.client.get("/readyz")).json()["batch"] is False
        body = {"embeddingProfile": PROFILE, "contexts": [context(1)], "via": "batch"}
        refused = await worker.client.post(
            BACKFILL_PATH, json=body, headers={"X-Internal-Secret": SECRET}
        )
        assert refused.status_code == 409


async def ledger_rows(engine) -> dict[str, tuple[int, int, float]]:
    """``{stage: (embedding_tokens, estimated_tokens, cost_usd)}`` of today's ledger."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT stage, embedding_tokens, estimated_tokens, cost_usd FROM "
                "ai.provider_usage_daily WHERE provider = 'embedding'"
            )
        )
        return {r.stage: (r.embedding_tokens, r.estimated_tokens, float(r.cost_usd)) for r in rows}


async def test_batch_tokens_count_at_submission_at_the_batch_price(
    engine, make_worker, fake_openai
):
    """The estimate is in the ledger (and so against the daily cap) once the batch is
    submitted, before any result; priced at PINLOG_PROVIDER_BATCH_DISCOUNT of the list price
    (text-embedding-3-small: 0.02 USD per million tokens). Once settled, the ledger row holds
    the results' own count (kept on the batch too), priced the same, and nothing estimated."""
    for context_id in (1, 2):
        await embedded_under_the_old_profile(engine, context_id)
    async with make_worker(**BATCH_SETTINGS, provider_batch_discount=0.5) as worker:
        fake_openai.batches.hold_batches(True)
        batch_id = (await submit(worker, [1, 2]))["batchId"]
        await worker.app.state.usage.flush()
        tokens, estimated, usd = (await ledger_rows(engine))["backfill_batch"]
        record = await batch_record(engine, batch_id)
        assert tokens == estimated == record["estimated_tokens"] > 0
        assert usd == pytest.approx(tokens * 0.02 / 1e6 * 0.5)
        fake_openai.batches.hold_batches(False)
        record = await settled(engine, batch_id)
        await worker.app.state.usage.flush()
        tokens, estimated, usd = (await ledger_rows(engine))["backfill_batch"]
    assert 0 < record["settled_tokens"] < record["estimated_tokens"]
    assert (tokens, estimated) == (record["settled_tokens"], 0)
    assert usd == pytest.approx(tokens * 0.02 / 1e6 * 0.5)


async def test_an_output_file_of_many_packets_is_read_to_its_end(engine, make_worker, fake_openai):
    """40 results of 1,536 floats (about 330 KB) arrive in many packets: every one is saved."""
    ids = list(range(1, 41))
    for context_id in ids:
        await embedded_under_the_old_profile(engine, context_id, note=f"긴 결과 메모 {context_id}")
    async with make_worker(**BATCH_SETTINGS) as worker:
        body = {
            "embeddingProfile": PROFILE,
            "contexts": [context(i, f"긴 결과 메모 {i}") for i in ids],
            "via": "batch",
        }
        answer = await worker.client.post(
            BACKFILL_PATH, json=body, headers={"X-Internal-Secret": SECRET}
        )
        await settled(engine, answer.json()["batchId"])
    assert {row[0] for row in (await held_rows(engine)).values()} == {"COMPLETED"}
