"""The provider gate through the running worker (§6).

Errors about one input (400 ``context_length_exceeded``) fail that stage only, with the reason
``input_too_long``, and never open the gate. Provider-wide faults:
``test_provider_wide_faults.py``.
"""

from __future__ import annotations

import asyncio
import logging

from tests.fake_openai import Scripted
from tests.worker.harness import PROFILE, SECRET, RunningWorker
from tests.worker.support import app_records, failure_reasons, fetch_state, make_state

NOTE = "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음."
CONTEXT_LENGTH = {
    "error": {
        "message": "This model's maximum context length is 8192 tokens",
        "type": "invalid_request_error",
        "code": "context_length_exceeded",
    }
}


async def _circuit_open(worker: RunningWorker, provider: str) -> float | None:
    return await worker.metric("pinlog_circuit_open", provider=provider)


async def _provider_errors(worker: RunningWorker, error: str) -> float | None:
    return await worker.metric("pinlog_provider_errors_total", provider="embedding", error=error)


async def _wait_for(tasks: set[asyncio.Task], count: int) -> set[asyncio.Task]:
    """The first ``count`` tasks to finish (bounded wait, no sleeping)."""
    done: set[asyncio.Task] = set()
    pending = set(tasks)
    async with asyncio.timeout(10):
        while len(done) < count:
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            done |= finished
    return done


async def test_context_length_errors_fail_their_own_stage_and_leave_the_breaker_closed(
    engine, make_worker, fake_openai, caplog
):
    """Five long notes answered 400 ``context_length_exceeded`` with threshold 3: each
    embedding ``FAILED`` with one WARNING (invalid input, FC-09); the breaker stays closed, so
    the next normal note completes and search answers 200 (no 503 for every user)."""
    fake_openai.script_embeddings(*(Scripted(status=400, json=CONTEXT_LENGTH) for _ in range(5)))
    async with make_worker(breaker_threshold=3) as worker:
        for context_id in range(1, 6):
            await make_state(engine, context_id=context_id)
            await worker.process(context_id, "긴 메모 " * 700)
        await make_state(engine, context_id=6)
        await worker.process(6, NOTE)
        response = await worker.client.post(
            "/internal/v1/search",
            json={"userId": 1, "query": "조용한 카페", "embeddingProfile": PROFILE},
            headers={"X-Internal-Secret": SECRET},
        )
        circuit_open = await _circuit_open(worker, "embedding")
        input_errors = await _provider_errors(worker, "invalid_input")
        refusals = await _provider_errors(worker, "provider_wide")

    for context_id in range(1, 6):
        assert await fetch_state(engine, context_id) == ("FAILED", "PENDING")
        assert await failure_reasons(engine, context_id) == ("input_too_long", None)
    assert await fetch_state(engine, 6) == ("COMPLETED", "COMPLETED")
    assert circuit_open == 0
    assert (input_errors, refusals) == (5, 0)
    assert not app_records(caplog, logging.ERROR)
    warnings = [r.getMessage() for r in app_records(caplog, logging.WARNING)]
    assert len(warnings) == 5
    assert all("cause=InvalidInputError" in m and "longer than the model" in m for m in warnings)
    assert response.status_code == 200
    assert [hit["contextId"] for hit in response.json()["results"]] == [6]
