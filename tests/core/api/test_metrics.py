"""``GET /metrics`` of the core service after real traffic. Each app has its
own registry, so these counts are this test's alone."""

from __future__ import annotations

import socket

import httpx
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from core_service.metrics import CoreMetrics
from core_service.operations_listener import create_ops_app
from core_service.repository.db import create_engine
from tests.core import support as facts
from tests.core.harness import bearer
from tests.worker.harness import sample_value
from tests.worker.support import set_statuses


async def _samples(core) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    body = (await core.ops.get("/metrics")).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


def _value(samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_core_metrics_count_this_apps_traffic(core_with_fake_worker, fake_worker, engine):
    core = core_with_fake_worker
    first = (await core.create(1, "첫 메모")).json()
    await core.create(1, "두 번째 메모")
    await core.client.put(
        f"/api/v1/contexts/{first['contextId']}", json={"body": "고친 메모"}, headers=bearer(1)
    )
    await core.client.get(f"/api/v1/public-records/{first['publicId']}", headers=bearer(2))
    refused = await core.client.delete(f"/api/v1/contexts/{first['contextId']}", headers=bearer(1))
    await fake_worker.wait_for_requests(3)
    await core.app.state.dispatcher.drain(5)
    exhausted = (await core.create(1, "다른 곳 메모", place="other")).json()["contextId"]
    await set_statuses(
        engine, context_id=exhausted, embedding_status="PENDING", keyword_status="PENDING",
        retry_count=3,
    )  # fmt: skip
    await facts.backdate(engine, exhausted, 301)
    await core.scheduler().run_once()

    samples = await _samples(core)

    assert refused.status_code == 409
    lifecycle = "pinlog_core_lifecycle_operations_total"
    assert _value(samples, lifecycle, operation="create", outcome="record_created") == 2
    assert _value(samples, lifecycle, operation="create", outcome="context_added") == 1
    assert _value(samples, lifecycle, operation="modify", outcome="replaced") == 1
    assert _value(samples, "pinlog_core_dispatches_total", origin="commit", result="accepted") >= 3
    assert _value(samples, "pinlog_core_finalized_total", reason="retries_exhausted") == 1
    latency = "pinlog_core_http_request_seconds_count"
    assert _value(samples, latency, route="/api/v1/records", method="POST", status="2xx") == 3
    assert (
        _value(
            samples, latency, route="/api/v1/contexts/{context_id}", method="DELETE", status="4xx"
        )
        == 1
    )
    assert (
        _value(
            samples,
            latency,
            route="/api/v1/public-records/{public_id}",
            method="GET",
            status="2xx",
        )
        == 1
    )


async def test_the_gauges_the_alert_rules_read_are_served(core_with_fake_worker):
    """What deploy/prometheus/pinlog-rules.yml reads from the core besides the status gauges:
    the database as the readiness check finds it at the scrape, the workers ready by profile
    beside the profile in use (the routing's first read at startup), and the pending expiry
    the lag is judged against."""
    samples = await _samples(core_with_fake_worker)

    assert _value(samples, "pinlog_core_database_up") == 1
    assert _value(samples, "pinlog_core_pending_expiry_seconds") == 300
    in_use = [labels for (name, labels), value in samples.items()
              if name == "pinlog_core_profile_in_use" and value == 1]  # fmt: skip
    assert len(in_use) == 1
    assert _value(samples, "pinlog_core_workers_ready", **dict(in_use[0])) == 1


async def test_database_up_is_0_when_the_database_does_not_answer_at_the_scrape():
    """The operations listener's scrape runs the readiness check: against a port nothing
    listens on, ``pinlog_core_database_up`` is 0 (and the scrape still answers 200)."""
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        port = placeholder.getsockname()[1]
    public = FastAPI()
    public.state.metrics = CoreMetrics()
    public.state.metrics_registry = public.state.metrics.registry
    public.state.probe_engine = create_engine(
        f"postgresql+asyncpg://pinlog:unused@127.0.0.1:{port}/pinlog", pool_size=1
    )
    try:
        transport = httpx.ASGITransport(app=create_ops_app(public))
        async with httpx.AsyncClient(transport=transport, base_url="http://ops") as client:
            answer = await client.get("/metrics")
    finally:
        await public.state.probe_engine.dispose()

    assert answer.status_code == 200
    assert sample_value(answer.text, "pinlog_core_database_up") == 0
