"""``GET /metrics`` of the worker after real traffic.

Each app owns its registry, so every count read here is this test's app's alone: the values
are exact, never "before + 1". Traffic goes through real HTTP, the in-process worker and the
fake OpenAI server; provider failures are scripted answers of that server.
"""

from __future__ import annotations

import socket
import threading

import numpy as np

from app.metrics import WorkerMetrics
from app.repository.db import create_engine
from app.service.health import Readiness
from app.service.presets import PresetCache
from tests.fake_openai import Scripted, embedding_body, error_body
from tests.worker.harness import PROFILE, SECRET, RunningWorker
from tests.worker.support import fetch_state, make_state, wait_for

NOTE = "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음."
PROCESS = "/internal/v1/context/process"
SEARCH = "/internal/v1/search"
HEADERS = {"X-Internal-Secret": SECRET}


def _process_body(context_id: int) -> dict[str, object]:
    return {"contextId": context_id, "userId": 7, "recordId": 70, "text": NOTE}


async def _search(worker: RunningWorker, **fields: object) -> int:
    body = {"userId": 7, "query": "조용한 카페", "embeddingProfile": PROFILE, **fields}
    return (await worker.client.post(SEARCH, json=body, headers=HEADERS)).status_code


async def _http_count(worker: RunningWorker, route: str, method: str, status: str):
    return await worker.metric(
        "pinlog_http_request_seconds_count", route=route, method=method, status=status
    )


async def test_processed_contexts_are_counted_by_stage_outcome_and_provider_call(
    engine, worker, fake_openai
):
    for context_id in (1, 2):
        await make_state(engine, context_id=context_id)
        response = await worker.client.post(
            PROCESS, json=_process_body(context_id), headers=HEADERS
        )
        assert response.status_code == 202
    await worker.drain()

    assert await fetch_state(engine, 2) == ("COMPLETED", "COMPLETED")
    assert fake_openai.judge_calls == 2
    for stage in ("embedding", "keyword"):
        outcomes = "pinlog_stage_outcomes_total"
        assert await worker.metric(outcomes, stage=stage, outcome="completed") == 2
        assert await worker.metric(outcomes, stage=stage, outcome="failed") == 0
        assert await worker.metric("pinlog_stages_in_flight", stage=stage) == 0
        assert await worker.metric("pinlog_reclaims_total", stage=stage) == 0
        assert await worker.metric("pinlog_stage_seconds_count", stage=stage) == 2
        stage_seconds = await worker.metric("pinlog_stage_seconds_sum", stage=stage)
        assert stage_seconds is not None and stage_seconds > 0
    for provider in ("embedding", "judge"):
        calls = "pinlog_provider_call_seconds_count"
        assert await worker.metric(calls, provider=provider, outcome="ok") == 2
        assert await worker.metric(calls, provider=provider, outcome="error") == 0
        seconds = await worker.metric(
            "pinlog_provider_call_seconds_sum", provider=provider, outcome="ok"
        )
        assert seconds is not None and seconds > 0
    # The harness sends one input per embedding request (EMBEDDING_BATCH_SIZE=1).
    assert await worker.metric("pinlog_embedding_batch_inputs_count") == 2
    assert await worker.metric("pinlog_embedding_batch_inputs_sum") == 2
    assert await worker.metric("pinlog_queue_depth") == 0
    assert await _http_count(worker, PROCESS, "POST", "2xx") == 2


async def test_provider_failures_are_counted_by_class_and_settle_the_stage(
    engine, worker, fake_openai
):
    """Embedding 503 (transient: left ``PROCESSING``), then for another context a judge 400
    naming the note (input: keyword ``FAILED`` with ``input_rejected``, counted by reason)."""
    await make_state(engine, context_id=1)
    await make_state(engine, context_id=2)
    fake_openai.script_embeddings(Scripted(status=503))
    fake_openai.script_judge(Scripted(status=400, json=error_body("bad", param="messages")))

    await worker.process(1, NOTE)
    await worker.process(2, NOTE)

    assert await fetch_state(engine, 1) == ("PROCESSING", "PENDING")
    assert await fetch_state(engine, 2) == ("COMPLETED", "FAILED")
    errors = "pinlog_provider_errors_total"
    assert await worker.metric(errors, provider="embedding", error="transient") == 1
    assert await worker.metric(errors, provider="embedding", error="permanent") == 0
    assert await worker.metric(errors, provider="judge", error="invalid_input") == 1
    assert await worker.metric(errors, provider="judge", error="transient") == 0
    calls = "pinlog_provider_call_seconds_count"
    assert await worker.metric(calls, provider="embedding", outcome="error") == 1
    assert await worker.metric(calls, provider="embedding", outcome="ok") == 1
    assert await worker.metric(calls, provider="judge", outcome="error") == 1
    outcomes = "pinlog_stage_outcomes_total"
    assert await worker.metric(outcomes, stage="embedding", outcome="transient") == 1
    assert await worker.metric(outcomes, stage="embedding", outcome="completed") == 1
    assert await worker.metric(outcomes, stage="keyword", outcome="failed") == 1
    assert await worker.metric(outcomes, stage="keyword", outcome="completed") == 0
    failures = "pinlog_stage_failures_total"
    assert await worker.metric(failures, stage="keyword", reason="input_rejected") == 1
    assert await worker.metric(failures, stage="embedding", reason="input_rejected") == 0


async def test_search_latency_is_observed_by_outcome_and_status(engine, worker, fake_openai):
    """200, 422 (another profile: no provider call), 503 (provider 500), 502 (a zero vector)."""
    fake_openai.script_embeddings(
        Scripted(status=200),
        Scripted(status=500),
        Scripted(json=embedding_body([np.zeros(1536)])),
    )

    statuses = [
        await _search(worker),
        await _search(worker, embeddingProfile="another-profile-v1"),
        await _search(worker),
        await _search(worker),
    ]

    assert statuses == [200, 422, 503, 502]
    for outcome, expected in [
        ("ok", 1),
        ("invalid", 1),
        ("unavailable", 1),
        ("provider_failed", 1),
        ("error", 0),
    ]:
        assert await worker.metric("pinlog_search_seconds_count", outcome=outcome) == expected
    errors = "pinlog_provider_errors_total"
    assert await worker.metric(errors, provider="embedding", error="transient") == 1
    assert await worker.metric(errors, provider="embedding", error="permanent") == 1
    assert await worker.metric("pinlog_embedding_batch_inputs_count") == 3
    assert await _http_count(worker, SEARCH, "POST", "2xx") == 1
    assert await _http_count(worker, SEARCH, "POST", "4xx") == 1
    assert await _http_count(worker, SEARCH, "POST", "5xx") == 2


async def test_http_labels_stay_in_fixed_sets_for_refused_and_unknown_requests(worker):
    """A wrong secret is refused before routing; unknown paths and methods never become
    labels of their own."""
    refused = await worker.client.post(PROCESS, json=_process_body(1))
    unknown_path = await worker.client.get("/internal/v1/no-such-thing-42", headers=HEADERS)
    unknown_method = await worker.client.request("PURGE", "/healthz")
    await worker.client.get("/healthz")

    assert (refused.status_code, unknown_path.status_code) == (401, 404)
    assert unknown_method.status_code == 405
    assert await _http_count(worker, "unmatched", "POST", "4xx") == 1
    assert await _http_count(worker, "unmatched", "GET", "4xx") == 1
    assert await _http_count(worker, "/healthz", "other", "4xx") == 1
    assert await _http_count(worker, "/healthz", "GET", "2xx") == 1
    exposition = (await worker.client.get("/metrics")).text
    assert "no-such-thing-42" not in exposition
    assert "PURGE" not in exposition


async def test_queue_depth_stages_in_flight_and_rejections_while_the_only_worker_is_held(
    engine, make_worker, fake_openai
):
    for context_id in (1, 2, 3):
        await make_state(engine, context_id=context_id)
    release = threading.Event()
    held = Scripted(block=release)
    fake_openai.script_embeddings(held)

    async with make_worker(queue_capacity=1, worker_concurrency=1) as worker:
        try:
            await worker.post(_process_body(1))
            await wait_for(held.entered)  # the only worker task is in context 1's embedding
            await worker.post(_process_body(2))  # queued
            refused = await worker.post(_process_body(3))
            depth_while_held = await worker.metric("pinlog_queue_depth")
            in_flight = await worker.metric("pinlog_stages_in_flight", stage="embedding")
        finally:
            release.set()
        await worker.drain()
        depth_after = await worker.metric("pinlog_queue_depth")
        in_flight_after = await worker.metric("pinlog_stages_in_flight", stage="embedding")
        rejected = await worker.metric(
            "pinlog_process_requests_rejected_total", reason="queue_full"
        )
        rejected_stopping = await worker.metric(
            "pinlog_process_requests_rejected_total", reason="shutting_down"
        )

    assert refused.status_code == 503
    assert (depth_while_held, in_flight) == (1, 1)
    assert (depth_after, in_flight_after) == (0, 0)
    assert (rejected, rejected_stopping) == (1, 0)


async def test_two_app_instances_in_one_process_count_independently(
    engine, worker, make_worker, fake_openai
):
    await make_state(engine, context_id=1)
    async with make_worker() as other:
        await worker.process(1, NOTE)
        await other.client.get("/healthz")

        completed = "pinlog_stage_outcomes_total"
        assert await worker.metric(completed, stage="embedding", outcome="completed") == 1
        assert await other.metric(completed, stage="embedding", outcome="completed") == 0
        assert (
            await other.metric(
                "pinlog_provider_call_seconds_count", provider="embedding", outcome="ok"
            )
            == 0
        )
        assert (
            await worker.metric(
                "pinlog_provider_call_seconds_count", provider="embedding", outcome="ok"
            )
            == 1
        )
        assert await _http_count(other, "/healthz", "GET", "2xx") == 1
        assert await _http_count(worker, "/healthz", "GET", "2xx") is None
    assert worker.app.state.metrics.registry is not other.app.state.metrics.registry


async def test_database_up_is_the_readiness_check_run_when_scraped(worker):
    """``pinlog_database_up``: 1 while the database answers the readiness check, 0 for a
    database that does not answer (a port nothing listens on), each set by the scrape."""
    up = await worker.metric("pinlog_database_up")
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]
    engine = create_engine(
        f"postgresql+asyncpg://pinlog:unused@127.0.0.1:{port}/pinlog",
        pool_size=1,
        with_vector_codec=False,
    )
    metrics = WorkerMetrics()
    readiness = Readiness(engine, PresetCache(engine, PROFILE), {}, profile=PROFILE)
    try:
        await readiness.export_gauges(metrics)
    finally:
        await readiness.aclose()
        await engine.dispose()

    assert up == 1
    assert metrics.registry.get_sample_value("pinlog_database_up") == 0
