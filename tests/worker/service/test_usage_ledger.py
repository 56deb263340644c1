"""Token and cost accounting: the answer's ``usage`` (or the bytes ÷ 3 estimate
when it has none) in ``pinlog_provider_tokens_total`` and in ``ai.provider_usage_daily``,
written off the hot path, on shutdown, and as the worker's role may.

The fake provider sends realistic ``usage`` (about four characters per token) and remembers
what it sent, so the ledger is compared with the provider's own figures.
"""

from __future__ import annotations

import asyncio
import math
from decimal import Decimal

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from app.metrics import WorkerMetrics
from app.providers.usage import CallUsage
from app.repository.usage_ledger import UsageDelta, UsageRelease, add_usage, release_estimates
from app.service.usage_ledger import UsageLedger
from app.settings.costs import ModelPrice
from tests.fake_openai import Scripted, embedding_body
from tests.worker.harness import PROFILE, SECRET
from tests.worker.open_transactions import finished_behind_lock, lock_waiters_reach
from tests.worker.support import fetch_state, make_state

NOTES = (
    "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음.",
    "Brunch on the terrace with friends, the pancakes were great.",
    "비 오는 날 혼자 가기 좋은 국밥집",
)
HEADERS = {"X-Internal-Secret": SECRET}


async def _ledger(engine) -> dict[tuple[str, str], dict]:
    async with engine.connect() as conn:
        rows = (
            await conn.execute(
                text(
                    "SELECT provider, model, stage, calls, prompt_tokens, completion_tokens, "
                    "embedding_tokens, estimated_tokens, cost_usd, cached_prompt_tokens, "
                    "day = (now() AT TIME ZONE 'UTC')::date AS today "
                    "FROM ai.provider_usage_daily"
                )
            )
        ).mappings()
        return {(row["provider"], row["stage"]): dict(row) for row in rows}


async def _run(worker, engine, notes=NOTES) -> None:
    for context_id, note in enumerate(notes, start=1):
        await make_state(engine, context_id=context_id)
        body = {"contextId": context_id, "userId": 7, "recordId": context_id, "text": note}
        response = await worker.client.post(
            "/internal/v1/context/process", json=body, headers=HEADERS
        )
        assert response.status_code == 202
    await worker.drain()
    for context_id in range(1, len(notes) + 1):
        assert await fetch_state(engine, context_id) == ("COMPLETED", "COMPLETED")


async def test_ledger_rows_equal_the_sum_of_usage_over_a_run(engine, make_worker, fake_openai):
    async with make_worker() as worker:
        await _run(worker, engine)
        search = {"userId": 7, "query": "조용한 카페", "embeddingProfile": PROFILE}
        assert (
            await worker.client.post("/internal/v1/search", json=search, headers=HEADERS)
        ).status_code == 200
        sent = fake_openai.usage_sent
        embedding_metric = await worker.metric(
            "pinlog_provider_tokens_total", provider="embedding",
            model="text-embedding-3-small", stage="embedding", kind="embedding",
        )  # fmt: skip
        completion_metric = await worker.metric(
            "pinlog_provider_tokens_total", provider="judge", model="fake-chat",
            stage="keyword", kind="completion",
        )  # fmt: skip
    # Shut down: the last totals were written by aclose.
    ledger = await _ledger(engine)

    stage_embeddings = [usage["prompt_tokens"] for usage in sent["embeddings"][: len(NOTES)]]
    search_embeddings = sent["embeddings"][len(NOTES)]["prompt_tokens"]
    judge_prompt = sum(usage["prompt_tokens"] for usage in sent["judge"])
    judge_completion = sum(usage["completion_tokens"] for usage in sent["judge"])
    assert set(ledger) == {
        ("embedding", "embedding"),
        ("embedding", "search"),
        ("judge", "keyword"),
    }
    assert all(row["today"] and row["estimated_tokens"] == 0 for row in ledger.values())
    embedded = ledger["embedding", "embedding"]
    assert (embedded["calls"], embedded["embedding_tokens"]) == (3, sum(stage_embeddings))
    assert embedded["prompt_tokens"] == embedded["completion_tokens"] == 0
    assert ledger["embedding", "search"]["embedding_tokens"] == search_embeddings
    judged = ledger["judge", "keyword"]
    # A note with no candidate above the floor is judged without a call.
    assert (judged["calls"], judged["prompt_tokens"], judged["completion_tokens"]) == (
        len(sent["judge"]), judge_prompt, judge_completion,
    )  # fmt: skip
    assert embedding_metric == sum(stage_embeddings)
    assert completion_metric == judge_completion
    # text-embedding-3-small at USD 0.02 per million; fake-chat has no price: tokens only.
    assert embedded["cost_usd"] == Decimal(sum(stage_embeddings)) * Decimal("0.02") / 1_000_000
    assert judged["cost_usd"] is None
    per_context = (sum(stage_embeddings) + judge_prompt + judge_completion) / len(NOTES)
    print(f"\ntokens per context (ledger, fake provider): {per_context:.1f}")


async def test_answers_without_usage_are_estimated_and_marked(engine, make_worker, fake_openai):
    fake_openai.set_usage(False)
    async with make_worker() as worker:
        await _run(worker, engine, NOTES[:1])
    ledger = await _ledger(engine)

    (sent_text,) = fake_openai.embedding_requests[0]["input"]
    embedded = ledger["embedding", "embedding"]
    assert embedded["embedding_tokens"] == math.ceil(len(sent_text.encode()) / 3)
    assert embedded["estimated_tokens"] == embedded["embedding_tokens"]
    judged = ledger["judge", "keyword"]
    assert judged["prompt_tokens"] > 0 and judged["completion_tokens"] > 0
    assert judged["estimated_tokens"] == judged["prompt_tokens"] + judged["completion_tokens"]


async def test_the_ledger_is_written_while_running_at_most_once_per_interval(
    engine, make_worker, fake_openai
):
    async with make_worker(
        usage_flush_seconds=0.2, provider_prices={"fake-chat": {"prompt": 1, "completion": 2}}
    ) as worker:
        await _run(worker, engine, NOTES[:1])
        for _ in range(100):
            ledger = await _ledger(engine)
            if ("judge", "keyword") in ledger:
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the ledger was not written while the worker ran")
        judged = ledger["judge", "keyword"]
        expected = (judged["prompt_tokens"] * 1 + judged["completion_tokens"] * 2) / 1_000_000
        assert float(judged["cost_usd"]) == pytest.approx(expected)
        # Idle intervals write nothing.
        before = (await _ledger(engine))["judge", "keyword"]
        await asyncio.sleep(0.5)
        assert (await _ledger(engine))["judge", "keyword"] == before


async def test_the_worker_role_may_add_to_the_ledger_and_never_delete(engine) -> None:
    delta = UsageDelta("judge", "gpt-4o-mini", "keyword", 2, 10, 5, 0, 0, Decimal("0.000003"))
    async with engine.begin() as conn:
        await conn.execute(text("SET LOCAL ROLE pinlog_ai_worker"))
        await add_usage(conn, [delta])
        await add_usage(conn, [delta])
    ledger = await _ledger(engine)
    row = ledger["judge", "keyword"]
    assert (row["calls"], row["prompt_tokens"], row["cost_usd"]) == (4, 20, Decimal("0.000006"))
    async with engine.begin() as conn:
        await conn.execute(text("SET LOCAL ROLE pinlog_ai_worker"))
        with pytest.raises(DBAPIError, match="permission denied"):
            await conn.execute(text("DELETE FROM ai.provider_usage_daily"))


# A note long enough that its judge prompt passes OpenAI's 1,024-token caching threshold.
LONG_NOTE = "비 오는 날 혼자 조용히 책 읽기 좋은 카페, 창가 자리가 넓다. " * 150


async def test_cached_prompt_tokens_are_counted_and_priced_at_the_cached_price(
    engine, make_worker, fake_openai
):
    prices = {"fake-chat": {"prompt": 1, "completion": 2, "cached_prompt": 0.25}}
    async with make_worker(provider_prices=prices) as worker:
        # The same long note twice: the second judge request repeats the first one's prompt.
        await _run(worker, engine, (LONG_NOTE, LONG_NOTE))
        cached_metric = await worker.metric(
            "pinlog_provider_tokens_total", provider="judge", model="fake-chat",
            stage="keyword", kind="cached_prompt",
        )  # fmt: skip
    ledger = await _ledger(engine)

    first, second = fake_openai.usage_sent["judge"]
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["prompt_tokens_details"]["cached_tokens"]
    # OpenAI's rule, as the fake applies it: 1,024 tokens, then steps of 128.
    assert cached >= 1024 and (cached - 1024) % 128 == 0
    assert cached <= second["prompt_tokens"]
    judged = ledger["judge", "keyword"]
    assert judged["cached_prompt_tokens"] == cached
    assert judged["prompt_tokens"] == first["prompt_tokens"] + second["prompt_tokens"]
    assert cached_metric == cached
    completion = first["completion_tokens"] + second["completion_tokens"]
    expected = (
        Decimal(judged["prompt_tokens"] - cached) * 1
        + Decimal(cached) * Decimal("0.25")
        + Decimal(completion) * 2
    ) / 1_000_000
    assert judged["cost_usd"] == expected


async def test_cached_tokens_of_an_embedding_answer_are_counted_at_the_input_price_by_default(
    engine, make_worker, fake_openai
):
    """text-embedding-3-small has no cached-input price: its cached tokens cost the input
    price; an answer's cached figure beyond its prompt is not believed past it."""
    body = embedding_body([[1.0] + [0.0] * 1535], model="text-embedding-3-small")
    body["usage"] = {
        "prompt_tokens": 40,
        "total_tokens": 40,
        "prompt_tokens_details": {"cached_tokens": 99},
    }
    fake_openai.script_embeddings(Scripted(json=body))
    async with make_worker() as worker:
        await _run(worker, engine, NOTES[:1])
    embedded = (await _ledger(engine))["embedding", "embedding"]
    assert (embedded["embedding_tokens"], embedded["cached_prompt_tokens"]) == (40, 40)
    assert embedded["cost_usd"] == Decimal(40) * Decimal("0.02") / 1_000_000


async def test_no_cached_tokens_without_a_repeated_prefix_of_1024_tokens(
    engine, make_worker, fake_openai
):
    async with make_worker() as worker:
        await _run(worker, engine, (NOTES[0], NOTES[0]))
    assert [
        u["prompt_tokens_details"]["cached_tokens"] for u in fake_openai.usage_sent["judge"]
    ] == [0, 0]
    assert (await _ledger(engine))["judge", "keyword"]["cached_prompt_tokens"] == 0


async def test_two_processes_adding_cached_tokens_to_one_new_row_sum_up(engine) -> None:
    """Two writers' first row of the day at once: the second waits on the first's uncommitted
    insert, then adds to it (ON CONFLICT), cached tokens included; nothing is lost."""
    first = UsageDelta(
        "judge", "gpt-4o-mini", "keyword", 1, 2000, 10, 0, 0, Decimal("0.0002"), 1152
    )
    second = UsageDelta(
        "judge", "gpt-4o-mini", "keyword", 1, 3000, 20, 0, 0, Decimal("0.0003"), 2048
    )

    async def add_in_own_transaction(delta: UsageDelta) -> None:
        async with engine.begin() as conn:
            await conn.execute(text("SET LOCAL ROLE pinlog_ai_worker"))
            await add_usage(conn, [delta])

    async with engine.connect() as holder:
        transaction = await holder.begin()
        await holder.execute(text("SET LOCAL ROLE pinlog_ai_worker"))
        await add_usage(holder, [first])
        await finished_behind_lock(engine, add_in_own_transaction(second), transaction.commit)

    row = (await _ledger(engine))["judge", "keyword"]
    assert (row["calls"], row["prompt_tokens"], row["cached_prompt_tokens"]) == (2, 5000, 3200)
    assert row["cost_usd"] == Decimal("0.0005")


async def test_closing_the_ledger_during_a_write_keeps_what_that_write_carries(engine) -> None:
    """The periodic write waits behind a transaction that holds its ledger row when the ledger
    closes (shutdown): the close lets that write finish and its totals land, once. (Cancelled
    mid-write, the write dropped the totals it had taken, and the close had nothing left.)"""
    ledger = UsageLedger(engine, WorkerMetrics(), {}, flush_seconds=0.05)
    ledger.record("embedding", CallUsage("embedding", "m", None, embedding_tokens=10))
    await ledger.flush()  # the row exists
    ledger.start()
    async with engine.connect() as holder:
        held = await holder.begin()
        await holder.execute(
            text("SELECT 1 FROM ai.provider_usage_daily WHERE provider = 'embedding' FOR UPDATE")
        )
        ledger.record("embedding", CallUsage("embedding", "m", None, embedding_tokens=5))
        await lock_waiters_reach(engine, 1)  # the periodic write waits for the row
        closing = asyncio.create_task(ledger.aclose())
        await asyncio.sleep(0)  # the close has begun, the write still waits
        assert not closing.done()
        await held.rollback()
    await closing

    row = (await _ledger(engine))[("embedding", "embedding")]
    assert (row["calls"], row["embedding_tokens"]) == (2, 15)


async def _batch_submitted(engine, batch_id: str, days_ago: int) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO ai.provider_batch (batch_id, kind, embedding_profile, status, "
                "items, input_file_id, estimated_tokens, submitted_at) VALUES (:id, 'keyword', "
                ":profile, 'in_progress', 1, 'file-1', 1000, now() - make_interval(days => :d))"
            ),
            {"id": batch_id, "profile": PROFILE, "d": days_ago},
        )


async def _batch_rows(engine) -> dict[bool, tuple[int, int, Decimal]]:
    """``{today: (prompt_tokens, estimated_tokens, cost_usd)}`` of the keyword_batch rows."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT day = (now() AT TIME ZONE 'UTC')::date AS today, prompt_tokens, "
                "estimated_tokens, cost_usd FROM ai.provider_usage_daily "
                "WHERE stage = 'keyword_batch'"
            )
        )
        return {r.today: (r.prompt_tokens, r.estimated_tokens, r.cost_usd) for r in rows}


async def test_a_settled_batch_takes_its_unused_estimate_back_from_its_submission_day(
    engine,
) -> None:
    """A batch submitted yesterday counted 1,000 estimated prompt tokens on yesterday's row;
    its results report 600: settling takes 400 (and their batch-priced cost) back from that
    row and marks nothing estimated there, while today's row, written by another process at
    the same time, is untouched. A release above what a row holds stops at zero."""
    price = {"gpt-4o-mini": ModelPrice(prompt=0.15)}
    await _batch_submitted(engine, "batch-yesterday", days_ago=1)
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO ai.provider_usage_daily (day, provider, model, stage, calls, "
                "prompt_tokens, estimated_tokens, cost_usd) VALUES ((now() AT TIME ZONE "
                "'UTC')::date - 1, 'judge', 'gpt-4o-mini', 'keyword_batch', 1, 1000, 1000, "
                "0.000075)"
            )
        )
    ledger = UsageLedger(engine, WorkerMetrics(), price, flush_seconds=60, batch_discount=0.5)
    other = UsageLedger(engine, WorkerMetrics(), price, flush_seconds=60, batch_discount=0.5)
    over = CallUsage("judge", "gpt-4o-mini", None, prompt_tokens=400)
    ledger.release("keyword_batch", over, batch_id="batch-yesterday", estimate=1000)
    other.record(
        "keyword_batch", CallUsage("judge", "gpt-4o-mini", None, prompt_tokens=500, estimated=True)
    )
    await asyncio.gather(ledger.flush(), other.flush())

    rows = await _batch_rows(engine)
    assert rows[False] == (600, 0, Decimal("0.000045"))  # 600 x 0.15 / 1e6 x 0.5
    assert rows[True][:2] == (500, 500)

    ledger.release(
        "keyword_batch",
        CallUsage("judge", "gpt-4o-mini", None, prompt_tokens=5000),
        batch_id="batch-yesterday",
        estimate=5000,
    )
    await ledger.flush()
    assert (await _batch_rows(engine))[False] == (0, 0, Decimal("0"))


async def test_the_worker_role_may_release_an_estimate(engine) -> None:
    await _batch_submitted(engine, "batch-today", days_ago=0)
    async with engine.begin() as conn:
        await conn.execute(text("SET LOCAL ROLE pinlog_ai_worker"))
        delta = UsageDelta("judge", "gpt-4o-mini", "keyword_batch", 1, 900, 0, 0, 900, None)
        await add_usage(conn, [delta])
        release = UsageRelease(
            "batch-today", "judge", "gpt-4o-mini", "keyword_batch", 300, 0, 900, None
        )
        await release_estimates(conn, [release])
    assert (await _batch_rows(engine))[True] == (600, 0, None)
