"""``POST /internal/v1/backfill/embed`` over real HTTP, the embedding provider being the fake
OpenAI server (docs/operations.md "Switching the embedding profile";
``app.service.profile_backfill``), and the process route's answer to a request routed for
another profile.

200 with counts by result; 409 for another profile (nothing claimed); 422 for a malformed
body; 503 with ``Retry-After`` when busy or the provider is unavailable, the claimed rows put
back to ``PENDING``, never ``FAILED``; only a note the provider refuses as its own fault ends
``FAILED``, with its reason.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy import text

from app.providers.hashing import hash_embed
from app.repository import profile_vectors
from app.repository.profile_vectors import BackfillAsk
from app.service.profile_backfill import SLOT_WAIT_SECONDS
from pinlog_platform.contract.text_fingerprint import fingerprint
from tests.fake_openai import Scripted, error_body
from tests.worker.backfill_support import (
    BACKFILL_PATH,
    backfill_row,
    make_backfill,
    post_backfill,
    vector_rows,
    vectors_by_profile,
)
from tests.worker.backfill_support import BackfillRow as Row
from tests.worker.backfill_support import backfill_counts as counts
from tests.worker.harness import PROFILE, SECRET
from tests.worker.open_transactions import cancel_context
from tests.worker.support import (
    arrived,
    count_rows,
    fetch_state,
    make_embedding,
    make_state,
    process_request,
    release,
    vector,
)

OTHER_PROFILE = "local-use-multilingual-v3-512-cosine-v1"
DIMENSION = 1536
NOTES = {
    1: "창가 자리가 조용해서 노트북 작업하기 좋음",
    2: "비 오는 날 가기 좋은 아늑한 카페",
    3: "주차가 편하고 아이랑 가기 좋은 식당",
    4: "바다가 보이는 산책로, 해질녘이 예쁨",
    5: "브런치 메뉴가 다양하고 빵이 맛있음",
}
REJECTED_MARKER = "#REFUSED-BY-POLICY"
# Batches a worker embeds at once (ProfileBackfill's default, as app/composition.py builds it);
# one more waits up to SLOT_WAIT_SECONDS for a slot.
BATCH_SLOTS = 4


# --------------------------------------------------------------------------- builders


async def embedded_under_the_old_profile(
    engine, context_id: int, *, propose: bool = True, note: str | None = None
) -> None:
    """A context processed before the switch: both stages COMPLETED, its vector under the
    other profile, the core's digest of ``note`` (``NOTES[context_id]`` when ``None``) on its
    state row; ``propose``: the core proposed it for this worker's profile (PENDING)."""
    await make_state(
        engine,
        context_id=context_id,
        embedding_status="COMPLETED",
        keyword_status="COMPLETED",
        user_id=context_id,
        record_id=10 * context_id,
    )
    await make_embedding(
        engine,
        context_id=context_id,
        user_id=context_id,
        record_id=10 * context_id,
        profile=OTHER_PROFILE,
        embedding=vector(f"old {context_id}"),
    )
    if propose:
        await make_backfill(
            engine,
            context_id=context_id,
            profile=PROFILE,
            text=NOTES[context_id] if note is None else note,
        )


def context(context_id: int, note: str | None = None) -> dict[str, Any]:
    return {
        "contextId": context_id,
        "userId": context_id,
        "recordId": 10 * context_id,
        "text": NOTES[context_id] if note is None else note,
    }


def retry_after(response: httpx.Response) -> int:
    """The whole seconds of ``Retry-After`` (raises when it is not a number)."""
    return int(response.headers["Retry-After"])


async def assert_stored_under_this_profile(engine, context_id: int, note: str) -> None:
    """The note's vector (the fake's ``hash_embed``) under this worker's profile, beside the
    old profile's, which is unchanged."""
    vectors = await vectors_by_profile(engine, context_id)
    assert set(vectors) == {PROFILE, OTHER_PROFILE}
    assert vectors[PROFILE].shape == (DIMENSION,)
    np.testing.assert_allclose(vectors[PROFILE], hash_embed(note, DIMENSION), atol=1e-6)
    np.testing.assert_array_equal(vectors[OTHER_PROFILE], vector(f"old {context_id}"))


# --------------------------------------------------------------------------- 200


async def test_a_batch_is_embedded_in_one_call_and_stored_under_the_profile(
    engine, worker, fake_openai
):
    for context_id in (1, 2, 3):
        await embedded_under_the_old_profile(engine, context_id)
    await embedded_under_the_old_profile(engine, 4, propose=False)  # not proposed: no row

    response = await post_backfill(worker, [context(i) for i in (1, 2, 3, 4)])

    assert response.status_code == 200, response.text
    assert response.json() == counts(completed=3, not_claimed=1)
    assert fake_openai.embedding_calls == 1
    assert fake_openai.embedding_requests[0]["input"] == [NOTES[1], NOTES[2], NOTES[3]]
    for context_id in (1, 2, 3):
        assert await backfill_row(engine, context_id, PROFILE) == Row("COMPLETED", 1, None)
        await assert_stored_under_this_profile(engine, context_id, NOTES[context_id])
        # The live stages are not the backfill's: still both COMPLETED.
        assert await fetch_state(engine, context_id) == ("COMPLETED", "COMPLETED")
    assert set(await vectors_by_profile(engine, 4)) == {OTHER_PROFILE}


async def test_done_rows_are_not_claimed_again_and_cost_no_call(engine, worker, fake_openai):
    await embedded_under_the_old_profile(engine, 1)
    first = await post_backfill(worker, [context(1)])
    assert first.json() == counts(completed=1)

    again = await post_backfill(worker, [context(1)])

    assert again.status_code == 200
    assert again.json() == counts(not_claimed=1)
    assert fake_openai.embedding_calls == 1
    assert await backfill_row(engine, 1, PROFILE) == Row("COMPLETED", 1, None)


async def test_a_context_deleted_before_the_batch_is_not_claimed_nor_embedded(
    engine, worker, fake_openai
):
    """Deleted, replaced, its record deleted or its member withdrawn: the core cancels the
    state row in that transaction, and a backfill of it claims nothing and spends no provider
    call (the core closes the row: ``embedding_switch.propose``)."""
    for context_id in (1, 2):
        await embedded_under_the_old_profile(engine, context_id)
    await cancel_context(engine, context_id=2)

    response = await post_backfill(worker, [context(1), context(2)])

    assert response.json() == counts(completed=1, not_claimed=1)
    assert await backfill_row(engine, 2, PROFILE) == Row("PENDING", 0, None)
    assert set(await vectors_by_profile(engine, 2)) == {OTHER_PROFILE}
    assert [r["input"] for r in fake_openai.embedding_requests] == [[NOTES[1]]]
    await assert_stored_under_this_profile(engine, 1, NOTES[1])


async def test_a_delete_while_the_provider_call_is_in_flight_wins(
    engine, worker, fake_openai, hold
):
    for context_id in (1, 2):
        await embedded_under_the_old_profile(engine, context_id)
    held = hold()
    fake_openai.script_embeddings(held)

    batch = asyncio.create_task(post_backfill(worker, [context(1), context(2)]))
    await arrived(held)  # claimed, the provider call in flight, no transaction open
    await cancel_context(engine, context_id=1)
    release(held)
    response = await batch

    assert response.json() == counts(completed=1, cancelled=1)
    assert await backfill_row(engine, 1, PROFILE) == Row("CANCELLED", 1, None)
    assert set(await vectors_by_profile(engine, 1)) == {OTHER_PROFILE}
    await assert_stored_under_this_profile(engine, 2, NOTES[2])


async def test_a_batch_cut_by_the_request_deadline_puts_its_rows_back_at_once(
    engine, make_worker, fake_openai, hold
):
    """The worker's request deadline (503) ends a batch whose provider call hangs: the claimed
    rows are PENDING again at once, not left PROCESSING until the processing expiry."""
    for context_id in (1, 2):
        await embedded_under_the_old_profile(engine, context_id)
    held = hold()
    fake_openai.script_embeddings(held)

    async with make_worker(request_timeout_seconds=1.0) as worker:
        response = await post_backfill(worker, [context(1), context(2)])
        release(held)

    assert response.status_code == 503
    assert await backfill_row(engine, 1, PROFILE) == Row("PENDING", 1, None)
    assert await backfill_row(engine, 2, PROFILE) == Row("PENDING", 1, None)
    assert set(await vectors_by_profile(engine, 1)) == {OTHER_PROFILE}


async def test_a_batch_beyond_one_token_window_saves_what_fits_before_the_deadline(
    engine, make_worker, fake_openai
):
    """A token budget of about two of these notes a minute and a request deadline of 2 s: the
    batch is embedded run by run (``token_runs``), each run saved before the next, and the
    runs the budget cannot send before the deadline are put back ``PENDING`` at once,
    answered 200 (``putBack``). The next batch then starts where this one stopped; a batch
    cut whole by the deadline (503) would be proposed first again, in the same order, and
    spend its first run's tokens again every window, forever."""
    for context_id in NOTES:
        await embedded_under_the_old_profile(engine, context_id)
    fake_openai.set_usage(False)  # each request keeps its estimate (about 20 tokens a note)

    async with make_worker(request_timeout_seconds=2.0, embedding_tokens_per_minute=45) as worker:
        response = await post_backfill(worker, [context(c) for c in NOTES])

    assert response.status_code == 200
    body = response.json()
    assert body["completed"] >= 1
    assert body["completed"] + body["putBack"] == len(NOTES)
    rows = {c: await backfill_row(engine, c, PROFILE) for c in NOTES}
    done = [c for c, row in rows.items() if row.status == "COMPLETED"]
    assert len(done) == body["completed"]
    assert done == sorted(NOTES)[: len(done)], "runs go in the batch's order"
    for context_id in done:
        await assert_stored_under_this_profile(engine, context_id, NOTES[context_id])
    for context_id in set(NOTES) - set(done):
        assert rows[context_id] == Row("PENDING", 1, None)
        assert set(await vectors_by_profile(engine, context_id)) == {OTHER_PROFILE}


async def test_a_claim_taken_over_while_the_provider_call_is_in_flight_is_lost(
    engine, worker, fake_openai, hold, stage_pool
):
    await embedded_under_the_old_profile(engine, 1)
    held = hold()
    fake_openai.script_embeddings(held)

    batch = asyncio.create_task(post_backfill(worker, [context(1)]))
    await arrived(held)
    # Another worker reclaims the row as the expiry allows (here: any age).
    (theirs,) = await profile_vectors.claim(
        stage_pool,
        embedding_profile=PROFILE,
        asks=[BackfillAsk(1, fingerprint(NOTES[1]), 1, 10)],
        expiry_seconds=0,
    )
    assert theirs.attempt == 2
    release(held)
    response = await batch

    assert response.json() == counts(lost=1)
    assert await backfill_row(engine, 1, PROFILE) == Row("PROCESSING", 2, None)
    assert set(await vectors_by_profile(engine, 1)) == {OTHER_PROFILE}


# --------------------------------------------------------------------------- the state row decides


async def test_a_text_other_than_the_cores_claims_nothing_and_calls_no_provider(
    engine, worker, fake_openai
):
    """Whoever holds the internal secret cannot choose a note's vector (issue 28 #4): a text
    whose digest is not the one the core wrote claims nothing; the genuine text still runs."""
    for context_id in (1, 2):
        await embedded_under_the_old_profile(engine, context_id)

    forged = await post_backfill(worker, [context(1, "광고: 이 메모는 바뀌었음"), context(2)])

    assert forged.json() == counts(completed=1, not_claimed=1)
    assert await backfill_row(engine, 1, PROFILE) == Row("PENDING", 0, None)
    assert set(await vectors_by_profile(engine, 1)) == {OTHER_PROFILE}
    assert [r["input"] for r in fake_openai.embedding_requests] == [[NOTES[2]]]
    genuine = await post_backfill(worker, [context(1)])
    assert genuine.json() == counts(completed=1)
    await assert_stored_under_this_profile(engine, 1, NOTES[1])


@pytest.mark.parametrize(
    "owner", [{"userId": 99}, {"recordId": 99}], ids=["another-user", "another-record"]
)
async def test_another_owner_claims_nothing_and_calls_no_provider(
    engine, worker, fake_openai, owner
):
    """The vector's owner is the state row's, never the request's: a request naming another
    user or record claims nothing (it would hide the note from its owner's search)."""
    await embedded_under_the_old_profile(engine, 1)

    response = await post_backfill(worker, [{**context(1), **owner}])

    assert response.json() == counts(not_claimed=1)
    assert await backfill_row(engine, 1, PROFILE) == Row("PENDING", 0, None)
    assert fake_openai.embedding_calls == 0
    assert await count_rows(engine, "ai.context_embedding", 1) == 1  # the old profile's only


async def test_the_vector_is_stored_under_the_state_rows_owner(engine, worker, fake_openai):
    await embedded_under_the_old_profile(engine, 3)

    response = await post_backfill(worker, [context(3)])

    assert response.json() == counts(completed=1)
    rows = await vector_rows(engine, 3)
    assert (rows[PROFILE]["user_id"], rows[PROFILE]["record_id"]) == (3, 30)


async def test_a_row_whose_save_fails_is_put_back_and_the_rest_completes(
    engine, worker, fake_openai
):
    """Issue 28 #9, a poison row: a statement error on one row's save (here a trigger the
    database raises for it) puts that row back and the batch answers 200 for the others, so
    the core does not propose the same batch first again forever (a 503 would)."""
    for context_id in (1, 2, 3):
        await embedded_under_the_old_profile(engine, context_id)
    async with engine.begin() as conn:
        await conn.execute(text(POISON_FUNCTION))
        await conn.execute(text(POISON_TRIGGER))
    try:
        response = await post_backfill(worker, [context(1), context(2), context(3)])
    finally:
        async with engine.begin() as conn:
            await conn.execute(text("DROP TRIGGER poison_context_2 ON ai.context_embedding"))
            await conn.execute(text("DROP FUNCTION pg_temp_poison_context_2()"))

    assert response.status_code == 200, response.text
    assert response.json() == counts(completed=2, put_back=1)
    assert await backfill_row(engine, 2, PROFILE) == Row("PENDING", 1, None)
    for context_id in (1, 3):
        await assert_stored_under_this_profile(engine, context_id, NOTES[context_id])


# A database fault on one row only: inserting context 2's vector raises a data exception.
POISON_FUNCTION = """
    CREATE FUNCTION pg_temp_poison_context_2() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF NEW.context_id = 2 THEN
            RAISE EXCEPTION 'poison row' USING ERRCODE = '22023';
        END IF;
        RETURN NEW;
    END $$
"""
POISON_TRIGGER = """
    CREATE TRIGGER poison_context_2 BEFORE INSERT ON ai.context_embedding
    FOR EACH ROW EXECUTE FUNCTION pg_temp_poison_context_2()
"""


# --------------------------------------------------------------------------- the note's fault


async def test_a_note_the_provider_refuses_fails_alone_with_its_reason(engine, worker, fake_openai):
    refused = f"{NOTES[2]} {REJECTED_MARKER}"
    fake_openai.fail_inputs_containing(
        REJECTED_MARKER,
        Scripted(status=400, json=error_body("flagged", code="content_policy_violation")),
    )
    for context_id in (1, 3):
        await embedded_under_the_old_profile(engine, context_id)
    await embedded_under_the_old_profile(engine, 2, note=refused)

    response = await post_backfill(worker, [context(1), context(2, refused), context(3)])

    assert response.status_code == 200, response.text
    assert response.json() == counts(completed=2, failed=1)
    assert await backfill_row(engine, 2, PROFILE) == Row("FAILED", 1, "input_rejected")
    assert set(await vectors_by_profile(engine, 2)) == {OTHER_PROFILE}
    for context_id in (1, 3):
        assert await backfill_row(engine, context_id, PROFILE) == Row("COMPLETED", 1, None)
        await assert_stored_under_this_profile(engine, context_id, NOTES[context_id])
    # The whole batch once, then one call per note to find the refused one.
    assert [len(r["input"]) for r in fake_openai.embedding_requests] == [3, 1, 1, 1]
    # The note's own fault says nothing about the provider: it stays available.
    assert await worker.metric("pinlog_circuit_open", provider="embedding") == 0


async def test_a_blank_note_fails_without_a_provider_call(engine, worker, fake_openai):
    await embedded_under_the_old_profile(engine, 1, note=" \u200b\n ")
    await embedded_under_the_old_profile(engine, 2)

    response = await post_backfill(worker, [context(1, " \u200b\n "), context(2)])

    assert response.json() == counts(completed=1, failed=1)
    assert await backfill_row(engine, 1, PROFILE) == Row("FAILED", 1, "input_blank")
    assert [r["input"] for r in fake_openai.embedding_requests] == [[NOTES[2]]]


# --------------------------------------------------------------------------- 503


async def test_provider_5xx_answers_503_and_puts_every_claimed_row_back(
    engine, worker, fake_openai
):
    for context_id in (1, 2):
        await embedded_under_the_old_profile(engine, context_id)
    fake_openai.set_fault("embeddings", Scripted(status=500))

    response = await post_backfill(worker, [context(1), context(2)])

    assert response.status_code == 503, response.text
    assert retry_after(response) >= 1
    for context_id in (1, 2):
        assert await backfill_row(engine, context_id, PROFILE) == Row("PENDING", 1, None)
        assert set(await vectors_by_profile(engine, context_id)) == {OTHER_PROFILE}

    # Once the provider answers again, the same rows are claimed with the next attempt.
    fake_openai.set_fault("embeddings", None)
    retried = await post_backfill(worker, [context(1), context(2)])
    assert retried.json() == counts(completed=2)
    assert await backfill_row(engine, 1, PROFILE) == Row("COMPLETED", 2, None)


async def test_an_unavailable_provider_answers_503_and_claims_nothing_more(
    engine, make_worker, fake_openai
):
    for context_id in (1, 2):
        await embedded_under_the_old_profile(engine, context_id)
    fake_openai.set_fault(
        "embeddings",
        Scripted(status=401, json=error_body("bad key", code="invalid_api_key")),
    )
    async with make_worker(breaker_threshold=1) as worker:
        # The provider-wide fault opens the gate; the claimed row goes back.
        first = await post_backfill(worker, [context(1)])
        assert first.status_code == 503
        assert retry_after(first) >= 1
        assert await worker.metric("pinlog_circuit_open", provider="embedding") == 1
        calls = fake_openai.embedding_calls

        refused = await post_backfill(worker, [context(1), context(2)])

        assert refused.status_code == 503
        assert refused.json() == {"detail": "backfill refused: embedding provider unavailable"}
        # Until the next probe (the cooldown, 60 s by default).
        assert 1 <= retry_after(refused) <= 60
        assert fake_openai.embedding_calls == calls
    assert await backfill_row(engine, 1, PROFILE) == Row("PENDING", 1, None)
    assert await backfill_row(engine, 2, PROFILE) == Row("PENDING", 0, None)


async def start_held_batches(worker, fake_openai, hold, context_ids):
    """One batch per context, each held in its provider call; returned (the holds and the
    requests) once every call is in flight."""
    helds = [hold() for _ in context_ids]
    fake_openai.script_embeddings(*helds)
    tasks = [asyncio.create_task(post_backfill(worker, [context(i)])) for i in context_ids]
    for held in helds:
        await arrived(held)
    return helds, tasks


async def test_a_batch_beyond_the_running_ones_waits_for_a_slot(engine, worker, fake_openai, hold):
    ids = list(range(1, BATCH_SLOTS + 2))
    for context_id in ids:
        await embedded_under_the_old_profile(engine, context_id)
    helds, running = await start_held_batches(worker, fake_openai, hold, ids[:BATCH_SLOTS])
    extra = hold()
    fake_openai.script_embeddings(extra)

    waiting = asyncio.create_task(post_backfill(worker, [context(ids[-1])]))
    # Every slot is taken: the extra batch neither claims nor calls the provider meanwhile.
    assert not await asyncio.to_thread(extra.entered.wait, 1.0)
    assert await backfill_row(engine, ids[-1], PROFILE) == Row("PENDING", 0, None)
    release(helds[0])
    await arrived(extra)  # a slot came free: it runs
    for held in (*helds[1:], extra):
        release(held)
    answers = await asyncio.gather(*running, waiting)

    assert [a.json() for a in answers] == [counts(completed=1)] * len(ids)
    assert fake_openai.embedding_calls == len(ids)


async def test_a_batch_that_finds_no_slot_in_time_is_refused_busy_and_claims_nothing(
    engine, worker, fake_openai, hold
):
    ids = list(range(1, BATCH_SLOTS + 2))
    for context_id in ids:
        await embedded_under_the_old_profile(engine, context_id)
    helds, running = await start_held_batches(worker, fake_openai, hold, ids[:BATCH_SLOTS])

    asked_at = time.monotonic()
    busy = await post_backfill(worker, [context(ids[-1])])
    waited = time.monotonic() - asked_at
    for held in helds:
        release(held)
    answers = await asyncio.gather(*running)

    assert busy.status_code == 503
    assert busy.json() == {"detail": "backfill refused: busy"}
    assert waited >= SLOT_WAIT_SECONDS  # refused only after waiting for a slot
    assert retry_after(busy) >= 1
    assert await backfill_row(engine, ids[-1], PROFILE) == Row("PENDING", 0, None)
    assert [a.json() for a in answers] == [counts(completed=1)] * BATCH_SLOTS
    assert fake_openai.embedding_calls == BATCH_SLOTS


# --------------------------------------------------------------------------- 401, 409, 422


async def test_another_profile_is_409_and_nothing_is_claimed(engine, worker, fake_openai):
    await embedded_under_the_old_profile(engine, 1)

    response = await post_backfill(worker, [context(1)], profile=OTHER_PROFILE)

    assert response.status_code == 409
    assert PROFILE in response.json()["detail"]
    assert await backfill_row(engine, 1, PROFILE) == Row("PENDING", 0, None)
    assert fake_openai.embedding_calls == 0


async def test_missing_secret_is_401_and_nothing_is_claimed(engine, worker, fake_openai):
    await embedded_under_the_old_profile(engine, 1)

    response = await post_backfill(worker, [context(1)], secret=None)

    assert response.status_code == 401
    assert await backfill_row(engine, 1, PROFILE) == Row("PENDING", 0, None)
    assert fake_openai.embedding_calls == 0


def _batch(size: int) -> list[dict[str, Any]]:
    return [
        {"contextId": i, "userId": 1, "recordId": 1, "text": f"메모 {i}"}
        for i in range(1, size + 1)
    ]


MALFORMED = [
    pytest.param({"embeddingProfile": PROFILE, "contexts": []}, "contexts", id="no-contexts"),
    pytest.param(
        {"embeddingProfile": PROFILE, "contexts": _batch(257)}, "contexts", id="257-contexts"
    ),
    pytest.param({"contexts": _batch(1)}, "embeddingProfile", id="no-profile"),
    pytest.param(
        {"embeddingProfile": PROFILE, "contexts": [{"contextId": 1, "userId": 1, "text": "x"}]},
        "contexts",
        id="no-recordId",
    ),
    pytest.param(
        {
            "embeddingProfile": PROFILE,
            "contexts": [{"contextId": "1", "userId": 1, "recordId": 1, "text": "x"}],
        },
        "contexts",
        id="string-id",
    ),
    pytest.param(
        {"embeddingProfile": PROFILE, "contexts": [*_batch(1), *_batch(1)]},
        "contexts",
        id="repeated-contextId",
    ),
]


@pytest.mark.parametrize(("body", "field"), MALFORMED)
async def test_a_malformed_body_is_422_and_nothing_is_claimed(
    engine, worker, fake_openai, body, field
):
    await make_backfill(engine, context_id=1, profile=PROFILE)

    response = await worker.client.post(
        BACKFILL_PATH, json=body, headers={"X-Internal-Secret": SECRET}
    )

    assert response.status_code == 422
    assert {error["loc"][1] for error in response.json()["detail"]} == {field}
    assert await backfill_row(engine, 1, PROFILE) == Row("PENDING", 0, None)
    assert fake_openai.embedding_calls == 0


async def test_a_batch_of_256_is_accepted(engine, worker, fake_openai):
    response = await post_backfill(worker, _batch(256))

    assert response.status_code == 200
    assert response.json() == counts(not_claimed=256)  # none was proposed
    assert fake_openai.embedding_calls == 0


# --------------------------------------------------------------------------- process route


async def test_a_process_request_for_another_profile_is_409_and_claims_nothing(
    engine, worker, fake_openai
):
    await make_state(engine, context_id=1)

    response = await process_request(worker, context_id=1, text=NOTES[1], profile=OTHER_PROFILE)

    assert response.status_code == 409
    assert PROFILE in response.json()["detail"]
    assert worker.app.state.pool.queued == 0
    assert await fetch_state(engine, 1) == ("PENDING", "PENDING")
    assert await count_rows(engine, "ai.context_text_fingerprint", 1) == 0
    assert (fake_openai.embedding_calls, fake_openai.judge_calls) == (0, 0)


async def test_a_process_request_for_this_profile_is_accepted(engine, worker, fake_openai):
    await make_state(engine, context_id=1)

    response = await process_request(worker, context_id=1, text=NOTES[1], profile=PROFILE)

    assert response.status_code == 202
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert set(await vectors_by_profile(engine, 1)) == {PROFILE}
