"""Rate budgets in the running worker, with the window shortened to one second:
"N requests per minute" is tested as N per second, never by waiting minutes.
"""

from __future__ import annotations

import pytest

from app.service.provider_gate import RATE_LIMITED_REASON
from tests.fake_openai import Scripted
from tests.worker.harness import SECRET
from tests.worker.support import fetch_state, make_state

HEADERS = {"X-Internal-Secret": SECRET}
NOTES = ("노트북 들고 공부하기 좋은 조용한 카페", "Brunch on the terrace with friends")


def _most_in_any_window(arrivals: list[float], window: float) -> int:
    return max(
        (sum(1 for other in arrivals if start <= other < start + window) for start in arrivals),
        default=0,
    )


async def _post(worker, context_id: int):
    body = {
        "contextId": context_id, "userId": 7, "recordId": context_id,
        "text": f"{NOTES[context_id % 2]} #{context_id}",
    }  # fmt: skip
    return await worker.client.post("/internal/v1/context/process", json=body, headers=HEADERS)


@pytest.mark.serial  # a time bound that a loaded machine can miss
async def test_the_worker_stays_under_its_request_budgets_and_completes_all_work(
    engine, make_worker, fake_openai
):
    contexts = range(1, 15)
    for context_id in contexts:
        await make_state(engine, context_id=context_id)
    async with make_worker(
        embedding_requests_per_minute=6,
        judge_requests_per_minute=6,
        rate_budget_window_seconds=1.0,
        worker_concurrency=8,
    ) as worker:
        for context_id in contexts:
            assert (await _post(worker, context_id)).status_code == 202
        await worker.drain()

    for context_id in contexts:
        assert await fetch_state(engine, context_id) == ("COMPLETED", "COMPLETED")
    embeddings, judgments = fake_openai.embedding_arrivals, fake_openai.judge_arrivals
    assert len(embeddings) == len(contexts)
    # Server-side arrival stamps: a little slack against the grant times.
    assert _most_in_any_window(embeddings, 0.95) <= 6
    assert _most_in_any_window(judgments, 0.95) <= 6
    assert embeddings[-1] - embeddings[0] >= 2.0  # 14 requests need three windows


async def test_a_429_makes_only_that_provider_rate_limited_at_the_gate(
    engine, make_worker, fake_openai
):
    await make_state(engine, context_id=1)
    fake_openai.script_embeddings(Scripted(status=429, headers={"retry-after": "4"}))
    async with make_worker() as worker:
        assert (await _post(worker, 1)).status_code == 202
        await worker.drain()
        ready = (await worker.client.get("/readyz")).json()["providers"]
        refused = await _post(worker, 2)

    assert ready["embedding"]["available"] is False
    assert ready["embedding"]["reason"] == RATE_LIMITED_REASON
    assert 1 <= ready["embedding"]["retryAfterSeconds"] <= 4
    assert ready["judge"] == {"available": True, "retryAfterSeconds": None, "reason": None}
    assert refused.status_code == 503
    assert 1 <= int(refused.headers["Retry-After"]) <= 4
    # The rate-limited stage is transient (left for the rescan), never FAILED.
    assert "FAILED" not in await fetch_state(engine, 1)
