"""A fault every note would get is the provider's, not the note's (FC-12).

A real worker (the app on uvicorn, requests over HTTP) against the fake provider speaking each
provider-wide body of docs/failures.md ("Provider answers"). Ten notes, sent one at a time as
the core dispatches them: no stage ends ``FAILED``; after ``threshold`` faults the provider's
gate opens (``/readyz`` names it), the other process requests and, for the embedding
provider, searches answer 503 with ``Retry-After``; the provider sees ``threshold`` calls for
notes plus the worker's own probes. Then the fault clears: the probe reopens the gate and every
note completes when re-requested (the rescan's request after the expiry: the state rows are
backdated past it). Input faults still fail only their own note; reasoning verdicts complete.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from app.service.provider_probes import PROBE_TEXT
from tests.fake_openai import FakeOpenAI, Scripted, candidate_ids, error_body
from tests.worker.harness import PROFILE, SECRET, RunningWorker
from tests.worker.support import (
    backdate,
    failure_reasons,
    fetch_state,
    keyword_rows,
    make_state,
)

NOTES = 10
THRESHOLD = 3
EXPIRY_PLUS = 700  # seconds: older than the default 600 s PROCESSING expiry
NOTE = "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음. #{}"

FAULTS = {
    "judge-400-unsupported-temperature": (
        "judge",
        Scripted(
            status=400,
            json=error_body(
                "Unsupported value: 'temperature' does not support 0 with this model.",
                param="temperature",
                code="unsupported_value",
            ),
        ),
        "unsupported_parameter",
    ),
    "judge-400-response-format": (
        "judge",
        Scripted(
            status=400,
            json=error_body(
                "Invalid parameter: 'response_format' of type 'json_schema' is not supported",
                param="response_format",
            ),
        ),
        "unsupported_parameter",
    ),
    "embedding-429-insufficient-quota": (
        "embedding",
        Scripted(
            status=429,
            json=error_body(
                "You exceeded your current quota",
                type="insufficient_quota",
                code="insufficient_quota",
            ),
        ),
        "quota",
    ),
    "judge-429-insufficient-quota": (
        "judge",
        Scripted(
            status=429,
            json=error_body(
                "You exceeded your current quota",
                type="insufficient_quota",
                code="insufficient_quota",
            ),
        ),
        "quota",
    ),
    "embedding-401-invalid-api-key": (
        "embedding",
        Scripted(status=401, json=error_body("Incorrect API key", code="invalid_api_key")),
        "authentication",
    ),
    "judge-404-model-not-found": (
        "judge",
        Scripted(status=404, json=error_body("The model does not exist", code="model_not_found")),
        "unknown_model",
    ),
    "embedding-404-wrong-path": (
        "embedding",
        Scripted(status=404, raw_body="Not Found"),
        "not_found",
    ),
    "embedding-400-unrecognised": (
        "embedding",
        Scripted(status=400, json={"error": {"message": "Bad Request", "code": 400}}),
        "unrecognised",
    ),
    "embedding-200-protocol": (
        "embedding",
        Scripted(json={"object": "list", "data": [{"index": 0, "object": "embedding"}]}),
        "protocol",
    ),
}


def _endpoint(provider: str) -> str:
    return "embeddings" if provider == "embedding" else "judge"


def _calls(fake: FakeOpenAI, provider: str) -> tuple[int, int]:
    """``(calls for notes, probe calls)`` the fake received from ``provider``'s client."""
    requests = fake.embedding_requests if provider == "embedding" else fake.judge_requests
    probes = sum(PROBE_TEXT in json.dumps(r, ensure_ascii=False) for r in requests)
    return len(requests) - probes, probes


async def _post(worker: RunningWorker, context_id: int) -> httpx.Response:
    body = {"contextId": context_id, "userId": 1, "recordId": 1, "text": NOTE.format(context_id)}
    return await worker.post(body)


async def _search(worker: RunningWorker) -> httpx.Response:
    return await worker.client.post(
        "/internal/v1/search",
        json={"userId": 1, "query": "조용한 카페", "embeddingProfile": PROFILE},
        headers={"X-Internal-Secret": SECRET},
    )


async def _providers(worker: RunningWorker) -> dict[str, Any]:
    response = await worker.client.get("/readyz")
    assert response.status_code == 200  # the process can serve: never 503 for a provider
    return response.json()["providers"]


async def _until_available(worker: RunningWorker, provider: str) -> None:
    deadline = time.monotonic() + 10
    while not (await _providers(worker))[provider]["available"]:
        assert time.monotonic() < deadline, "the probe never reopened the gate"
        await asyncio.sleep(0.05)


async def _send_all(worker: RunningWorker, engine) -> list[httpx.Response]:
    answers = []
    for context_id in range(1, NOTES + 1):
        await make_state(engine, context_id=context_id)
        answers.append(await _post(worker, context_id))
        await worker.drain()
    return answers


@pytest.mark.parametrize(("provider", "fault", "reason"), FAULTS.values(), ids=list(FAULTS))
async def test_ten_notes_against_a_provider_wide_fault_end_none_failed_and_all_complete_after(
    engine, make_worker, fake_openai, provider, fault, reason
):
    fake_openai.set_fault(_endpoint(provider), fault)
    async with make_worker(
        breaker_threshold=THRESHOLD, breaker_cooldown_seconds=1, worker_concurrency=4
    ) as worker:
        answers = await _send_all(worker, engine)
        statuses = [await fetch_state(engine, i) for i in range(1, NOTES + 1)]
        note_calls, probes = _calls(fake_openai, provider)
        gate = (await _providers(worker))[provider]
        series = {"provider": provider, "reason": reason}
        shown = await worker.metric("pinlog_provider_unavailable", **series)
        searched = await _search(worker)

        fake_openai.set_fault(_endpoint(provider), None)
        await _until_available(worker, provider)
        cleared = await worker.metric("pinlog_provider_unavailable", **series)
        for context_id in range(1, NOTES + 1):
            await backdate(engine, context_id, seconds=EXPIRY_PLUS)
            assert (await _post(worker, context_id)).status_code == 202
            await worker.drain()
        after = [await fetch_state(engine, i) for i in range(1, NOTES + 1)]

    assert all("FAILED" not in pair for pair in statuses), statuses
    assert [a.status_code for a in answers] == [202] * THRESHOLD + [503] * (NOTES - THRESHOLD)
    for refused in answers[THRESHOLD:]:
        assert refused.json() == {"detail": f"{provider} provider unavailable"}
        assert refused.headers["Retry-After"] == "1"
    assert note_calls == THRESHOLD  # then only the worker's own probes
    assert gate["available"] is False and gate["reason"] == reason
    assert gate["retryAfterSeconds"] == 1
    assert (shown, cleared) == (1, 0), "the gauge the alert reads follows the gate"
    if provider == "embedding":
        assert searched.status_code == 503 and searched.headers["Retry-After"] == "1"
        assert searched.json() == {"detail": "embedding upstream unavailable"}
    else:
        assert searched.status_code == 200  # search needs only the embedding provider
    assert after == [("COMPLETED", "COMPLETED")] * NOTES
    assert probes >= 0


async def test_five_context_length_400s_among_normal_notes_fail_only_their_own_notes(
    engine, make_worker, fake_openai
):
    too_long = Scripted(
        status=400,
        json=error_body(
            "This model's maximum context length is 8192 tokens",
            param="input",
            code="context_length_exceeded",
        ),
    )
    fake_openai.fail_inputs_containing("#LONG", too_long)
    long_ids = {2, 4, 6, 8, 10}
    async with make_worker(breaker_threshold=THRESHOLD) as worker:
        for context_id in range(1, NOTES + 1):
            await make_state(engine, context_id=context_id)
            text = NOTE.format(context_id) + (" #LONG" if context_id in long_ids else "")
            body = {"contextId": context_id, "userId": 1, "recordId": 1, "text": text}
            assert (await worker.post(body)).status_code == 202
            await worker.drain()
        providers = await _providers(worker)

    for context_id in range(1, NOTES + 1):
        if context_id in long_ids:
            assert await fetch_state(engine, context_id) == ("FAILED", "PENDING")
            assert await failure_reasons(engine, context_id) == ("input_too_long", None)
        else:
            assert await fetch_state(engine, context_id) == ("COMPLETED", "COMPLETED")
            assert await failure_reasons(engine, context_id) == (None, None)
    assert providers["embedding"]["available"] is True


async def test_think_verdicts_complete_with_the_verdict_keywords_one_judge_call_each(
    engine, worker, fake_openai
):
    fake_openai.set_judge_reasoning(
        'The note is about studying. {"selected": []} maybe not.',
        reasoning_content="separate reasoning field, ignored",
    )
    fake_openai.set_judge_selection(lambda ids: [(ids[1], 0.8)])
    offered: dict[int, list[int]] = {}
    for context_id in range(1, NOTES + 1):
        await make_state(engine, context_id=context_id)
        assert (await _post(worker, context_id)).status_code == 202
        await worker.drain()
        offered[context_id] = candidate_ids(fake_openai.judge_requests[-1])

    for context_id in range(1, NOTES + 1):
        assert await fetch_state(engine, context_id) == ("COMPLETED", "COMPLETED")
        assert set(await keyword_rows(engine, context_id)) == {offered[context_id][1]}
    assert fake_openai.judge_calls == NOTES


async def test_with_refusals_off_the_worker_accepts_and_leaves_the_work_processing(
    engine, make_worker, fake_openai
):
    """``PINLOG_REFUSE_WHILE_PROVIDER_UNAVAILABLE=false`` (only for a core that spends a retry
    per refused dispatch): 202 while the gate is open, no provider call, stage ``PROCESSING``."""
    fake_openai.set_fault("embeddings", Scripted(status=401))
    async with make_worker(
        breaker_threshold=1,
        breaker_cooldown_seconds=600,
        refuse_while_provider_unavailable=False,
    ) as worker:
        answers = await _send_all(worker, engine)

    assert [a.status_code for a in answers] == [202] * NOTES
    assert fake_openai.embedding_calls == 1
    assert [await fetch_state(engine, i) for i in range(1, NOTES + 1)] == [
        ("PROCESSING", "PENDING")
    ] * NOTES
