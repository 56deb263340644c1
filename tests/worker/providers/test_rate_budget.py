"""Rate budgets against the fake provider over real HTTP: the sliding-window
budget, rate-limit headers, the 429 cooldown of one provider only, and embedding batches split
by tokens. Windows are shortened (a fraction of a second), never waited out in minutes.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from app.metrics import WorkerMetrics
from app.providers.base import JudgeCandidate
from app.providers.embedding_batcher import BatchingEmbedder
from app.providers.openai_compatible import OpenAIEmbedder, OpenAIJudge
from app.providers.rate_budget import RateBudget, parse_duration, per_process
from app.providers.usage import StageTagged
from tests.e2e.observe import wait_until
from tests.fake_openai import Scripted

CANDIDATE = JudgeCandidate(1, "Coffee", "food", "coffee", ("latte",), 0.5)


def _most_in_any_window(arrivals: list[float], window: float) -> int:
    return max(
        sum(1 for other in arrivals if start <= other < start + window) for start in arrivals
    )


def _embedder(fake) -> OpenAIEmbedder:
    return OpenAIEmbedder(
        base_url=fake.base_url, api_key="k", model="text-embedding-3-small",
        dimension=1536, timeout_seconds=10, max_retries=0,
    )  # fmt: skip


def _judge(fake) -> OpenAIJudge:
    return OpenAIJudge(
        base_url=fake.base_url, api_key="k", model="fake-chat", profile="openai:fake-chat",
        timeout_seconds=10, max_retries=0, metrics=WorkerMetrics(),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("6m0s", 360.0), ("20ms", 0.02), ("1s", 1.0), ("0.5s", 0.5), ("1h2m3.5s", 3723.5),
     ("2", 2.0), ("soon", None), ("", None), (None, None), ("5x", None)],
)  # fmt: skip
def test_reset_durations_are_read_as_openai_writes_them(value, seconds) -> None:
    assert parse_duration(value) == seconds


def test_each_replica_takes_its_share() -> None:
    assert (per_process(60, 3), per_process(0, 3), per_process(2, 4)) == (20, 0, 1)


@pytest.mark.serial  # a time bound that a loaded machine can miss
async def test_at_most_n_requests_in_any_window_while_every_call_completes(fake_openai):
    embedder = _embedder(fake_openai)
    embedder.use_budget(RateBudget("embedding", requests=5, tokens=0, window_seconds=0.4))
    try:
        await asyncio.gather(*(embedder.embed([f"note {i}"]) for i in range(13)))
    finally:
        await embedder.aclose()

    arrivals = fake_openai.embedding_arrivals
    assert len(arrivals) == 13
    # A little slack for the arrival stamp (taken on the server) versus the grant.
    assert _most_in_any_window(arrivals, 0.38) <= 5
    # 13 requests need three windows (0.8 s between the first and last grant); the same slack
    # for the stamps, which come later than the grants by each request's trip.
    assert arrivals[-1] - arrivals[0] >= 0.78


async def test_the_token_budget_is_corrected_by_the_answers_usage(fake_openai):
    """120 bytes are estimated as 40 tokens; the fake's usage says 30. With 70 tokens per
    window two calls fit at once only because the first was corrected to 30 (40 + 40 > 70);
    the third waits for the window."""
    embedder = _embedder(fake_openai)
    embedder.use_budget(RateBudget("embedding", requests=0, tokens=70, window_seconds=1.5))
    took = []
    try:
        for _ in range(3):
            started = time.monotonic()
            await embedder.embed(["a" * 120])
            took.append(time.monotonic() - started)
    finally:
        await embedder.aclose()
    assert took[0] < 0.5 and took[1] < 0.5
    assert took[2] >= 1.0


async def test_remaining_zero_headers_pause_until_the_reset(fake_openai):
    embedder = _embedder(fake_openai)
    embedder.use_budget(RateBudget("embedding", requests=0, tokens=0))
    fake_openai.script_embeddings(
        Scripted(
            headers={"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "400ms"}
        )
    )
    try:
        await embedder.embed(["first"])
        started = time.monotonic()
        await embedder.embed(["second"])
        waited = time.monotonic() - started
    finally:
        await embedder.aclose()
    assert waited >= 0.35


async def test_a_429_cools_down_that_provider_only(fake_openai):
    embedder, judge = _embedder(fake_openai), _judge(fake_openai)
    embedding_budget = RateBudget("embedding", requests=0, tokens=0)
    judge_budget = RateBudget("judge", requests=0, tokens=0)
    embedder.use_budget(embedding_budget)
    judge.use_budget(judge_budget)
    fake_openai.script_embeddings(Scripted(status=429, headers={"retry-after": "3"}))
    try:
        with pytest.raises(Exception, match="upstream 429"):
            await embedder.embed(["note"])
        assert 2 < embedding_budget.cooldown_seconds() <= 3
        started = time.monotonic()
        for _ in range(3):
            await judge.judge("note", [CANDIDATE])
        judged_in = time.monotonic() - started
        assert judge_budget.cooldown_seconds() == 0
        delayed = asyncio.create_task(embedder.embed(["after"]))
        await asyncio.sleep(0.5)
        assert not delayed.done(), "the embedding provider is still cooling down"
        await delayed
    finally:
        await embedder.aclose()
        await judge.aclose()
    assert judged_in < 1.0


async def test_a_quota_429_is_no_rate_limit_and_starts_no_cooldown(fake_openai):
    embedder = _embedder(fake_openai)
    budget = RateBudget("embedding", requests=0, tokens=0)
    embedder.use_budget(budget)
    fake_openai.script_embeddings(
        Scripted(status=429, json={"error": {"message": "q", "type": "insufficient_quota",
                                             "code": "insufficient_quota", "param": None}})
    )  # fmt: skip
    try:
        with pytest.raises(Exception, match="quota"):
            await embedder.embed(["note"])
    finally:
        await embedder.aclose()
    assert budget.cooldown_seconds() == 0


async def test_embedding_batches_are_split_by_tokens_as_well_as_by_count(fake_openai):
    embedder = _embedder(fake_openai)
    # Each text is 30 bytes: estimated 10 tokens; 25 tokens per batch: two texts at most.
    batcher = BatchingEmbedder(embedder, max_batch=16, max_wait_seconds=0.05, max_batch_tokens=25)
    try:
        await asyncio.gather(*(batcher.embed([f"{i:02d}" + "x" * 28]) for i in range(7)))
    finally:
        await batcher.aclose()
        await embedder.aclose()
    sizes = [len(request["input"]) for request in fake_openai.embedding_requests]
    assert sum(sizes) == 7
    assert max(sizes) == 2


def _retrying_embedder(fake, retries: int) -> OpenAIEmbedder:
    return OpenAIEmbedder(
        base_url=fake.base_url, api_key="k", model="text-embedding-3-small",
        dimension=1536, timeout_seconds=10, max_retries=retries,
    )  # fmt: skip


async def test_retries_take_the_request_budget_too(fake_openai):
    """6 requests a minute, 2 retries per call, a provider answering 503: six concurrent calls
    would send 18 requests within their backoffs (about 1.5 s) if retries were free. Only 6
    reach the provider; the retries wait for the next minute (the calls are ended here)."""
    fake_openai.set_fault("embeddings", Scripted(status=503))
    embedder = _retrying_embedder(fake_openai, retries=2)
    embedder.use_budget(RateBudget("embedding", requests=6, tokens=0, window_seconds=60))
    calls = [asyncio.create_task(embedder.embed([f"note {i}"])) for i in range(6)]
    try:
        # Long enough for every call's two backoffs (0.5 s, then at most 1 s) to have passed.
        done, pending = await asyncio.wait(calls, timeout=3)
    finally:
        for call in calls:
            call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        await embedder.aclose()
    assert not done and len(pending) == 6
    assert fake_openai.embedding_calls == 6


async def test_a_failed_attempt_keeps_its_estimate_unless_the_answer_reports_usage(fake_openai):
    """Tokens per window 100, each attempt estimated 40 (120 bytes). A 503 without usage keeps
    its 40; one whose body reports 5 tokens is settled to 5. After two failed attempts of each
    kind, a third request fits at once only in the second case (40 + 40 + 40 > 100, but
    5 + 5 + 40 <= 100)."""
    error = {"error": {"message": "busy", "type": "server_error", "code": None, "param": None}}
    outcomes = {}
    for reported in (False, True):
        body = {**error, "usage": {"prompt_tokens": 5, "total_tokens": 5}} if reported else error
        fake_openai.reset()
        fake_openai.set_fault("embeddings", Scripted(status=503, json=body))
        budget = RateBudget("embedding", requests=0, tokens=100, window_seconds=60)
        embedder = _retrying_embedder(fake_openai, retries=1)
        embedder.use_budget(budget)
        try:
            with pytest.raises(Exception, match="503"):
                await embedder.embed(["a" * 120])
            fake_openai.set_fault("embeddings", None)
            third = asyncio.create_task(embedder.embed(["b" * 120]))
            done, _ = await asyncio.wait([third], timeout=2)
            outcomes[reported] = bool(done)
            third.cancel()
            await asyncio.gather(third, return_exceptions=True)
        finally:
            await embedder.aclose()
    assert outcomes == {False: False, True: True}


async def test_one_embed_call_is_cut_into_requests_that_fit_the_token_budget(fake_openai):
    """Whoever calls (a backfill batch, the preset list): 7 texts of 10 estimated tokens each
    under a budget of 25 tokens a window go as requests of at most two texts, in order."""
    embedder = _embedder(fake_openai)
    embedder.use_budget(RateBudget("embedding", requests=0, tokens=25, window_seconds=0.2))
    texts = [f"{i:02d}" + "x" * 28 for i in range(7)]
    try:
        vectors = await embedder.embed(texts)
        alone = [await embedder.embed([text]) for text in texts]
    finally:
        await embedder.aclose()
    sizes = [len(request["input"]) for request in fake_openai.embedding_requests[:-7]]
    assert sizes == [2, 2, 2, 1]
    assert all((vector == single[0]).all() for vector, single in zip(vectors, alone, strict=True))


async def test_a_search_goes_ahead_of_waiting_stage_requests_and_still_counts(fake_openai):
    """Two requests per 0.6 s window; eight stage embeddings wait (four windows' worth). A
    search sent while they wait is the first request of the next window, not the ninth, and
    the window's bound holds for stage requests and the search together."""
    embedder = _embedder(fake_openai)
    embedder.use_budget(RateBudget("embedding", requests=2, tokens=0, window_seconds=0.6))
    stage, search = StageTagged(embedder, "embedding"), StageTagged(embedder, "search")
    try:
        backlog = [asyncio.create_task(stage.embed([f"stage note {i}"])) for i in range(8)]

        async def first_window_taken() -> bool:
            return len(fake_openai.embedding_requests) == 2

        await wait_until(first_window_taken, what="the first window's two stage requests")
        await search.embed(["member search"])
        await asyncio.gather(*backlog)
    finally:
        await embedder.aclose()

    order = [request["input"][0] for request in fake_openai.embedding_requests]
    assert len(order) == 9
    assert order.index("member search") == 2  # first of the second window
    assert _most_in_any_window(fake_openai.embedding_arrivals, 0.58) <= 2
