"""Traces of both services (``pinlog_platform.tracing``): nothing is created without an OTLP
endpoint; with one, a client's ``traceparent`` is linked or continued as trusted, errors are
named by class only, and JSON log lines written inside a span carry its ids. Spans go to a real
OTLP/HTTP receiver (``tests/otlp_receiver.py``)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from pinlog_platform import logging as log_output
from pinlog_platform import tracing
from tests.e2e.processes import core_environment
from tests.fake_openai import DEFAULT_DIMENSION
from tests.otlp_receiver import OtlpReceiver, exporting_to
from tests.worker.harness import SECRET

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
CLIENT_TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"

# Both services' startup as their CLIs run it (settings, logging, tracing, the app), in a fresh
# interpreter so nothing another test imported counts; prints what exists afterwards.
_STARTUP_WITHOUT_ENDPOINT = """
import gc, json, sys
from app.cli import _settings
from app.main import create_app as worker_app
from core_service.command_startup import load
from core_service.main import create_app as core_app
from core_service.settings import CoreSettings
from pinlog_platform import tracing

apps = [worker_app(_settings()), core_app(load(CoreSettings))]
with tracing.span("hot path", context_id=1) as span:
    inside = {"span": span, "headers": tracing.outgoing_headers(), "ids": tracing.current_ids()}
gc.collect()
made = sorted({type(o).__name__ for o in gc.get_objects()
               if type(o).__name__ in ("TracerProvider", "BatchSpanProcessor", "OTLPSpanExporter")})
print(json.dumps({
    "enabled": tracing.enabled(),
    "sdk_imported": sorted(m for m in sys.modules if m.startswith("opentelemetry.sdk")
                           or m.startswith("opentelemetry.exporter")),
    "made": made,
    "middleware": [m.cls.__name__ for app in apps for m in app.user_middleware],
    "inside": inside,
}))
"""


@pytest.mark.processes
def test_without_an_otlp_endpoint_no_provider_processor_or_exporter_is_created(
    migrated_database, fake_openai_server
):
    from tests.e2e.processes import worker_environment

    env = worker_environment(migrated_database, fake_openai_server) | core_environment(
        migrated_database, "http://127.0.0.1:9"
    )
    env = {k: v for k, v in env.items() if not k.startswith("OTEL_")}
    assert not any("OTLP" in key for key in env)
    done = subprocess.run(  # noqa: S603 (our own interpreter and script)
        [sys.executable, "-c", _STARTUP_WITHOUT_ENDPOINT],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout.splitlines()[-1])
    assert facts["enabled"] is False
    assert facts["sdk_imported"] == []
    assert facts["made"] == []
    assert "TraceContextMiddleware" not in facts["middleware"]
    assert facts["inside"] == {"span": None, "headers": None, "ids": None}


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


@pytest.fixture
def traced(receiver: OtlpReceiver) -> Iterator[OtlpReceiver]:
    with exporting_to(receiver) as exporting:
        yield exporting


def _app(*, trust_incoming: bool) -> tracing.TraceContextMiddleware:
    async def record(request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/api/v1/records/{record_id}", record)])
    return tracing.TraceContextMiddleware(app, trust_incoming=trust_incoming)


@pytest.mark.parametrize("trusted", [False, True])
async def test_a_clients_traceparent_is_linked_unless_trusted(traced: OtlpReceiver, trusted: bool):
    transport = httpx.ASGITransport(app=_app(trust_incoming=trusted))
    async with httpx.AsyncClient(transport=transport, base_url="http://core") as client:
        answer = await client.get(
            "/api/v1/records/7?q=private", headers={"traceparent": CLIENT_TRACEPARENT}
        )
    assert answer.status_code == 200
    tracing.shutdown()

    (served,) = traced.spans
    assert served.name == "GET /api/v1/records/{record_id}"
    assert served.attributes == {
        "http.request.method": "GET",
        "http.route": "/api/v1/records/{record_id}",
        "http.response.status_code": 200,
    }
    if trusted:
        assert (served.trace_id, served.parent_span_id, served.links) == (
            CLIENT_TRACE,
            CLIENT_SPAN,
            (),
        )
    else:
        assert served.trace_id != CLIENT_TRACE and served.parent_span_id == ""
        assert served.links == ((CLIENT_TRACE, CLIENT_SPAN),)
    assert b"private" not in b"".join(traced.payloads)


def test_an_error_is_named_by_its_class_never_its_message(traced: OtlpReceiver):
    with pytest.raises(ValueError, match="note text"), tracing.span("save keywords", context_id=5):
        raise ValueError(f"note text {SECRET}")
    tracing.shutdown()

    (failed,) = traced.spans
    assert failed.attributes == {"pinlog.context_id": 5, "error.type": "ValueError"}
    assert failed.events == ()
    assert SECRET.encode() not in b"".join(traced.payloads)


def test_json_lines_written_inside_a_span_carry_its_trace_and_span_ids(
    traced: OtlpReceiver, restore_root_logging, capfd
):
    log_output.configure("json")
    log = logging.getLogger("pinlog.test")

    with tracing.span("process context", context_id=3), log_output.log_context(context_id=3):
        log.info("inside")
    log.info("outside")
    tracing.shutdown()

    inside, outside = (json.loads(line) for line in capfd.readouterr().err.splitlines()[-2:])
    (span,) = traced.spans
    assert (inside["message"], inside["trace_id"], inside["span_id"]) == (
        "inside",
        span.trace_id,
        span.span_id,
    )
    assert outside["message"] == "outside"
    assert "trace_id" not in outside and "span_id" not in outside


@pytest.mark.parametrize("send", [False, True])
async def test_providers_get_a_traceparent_only_when_the_setting_says_so(
    traced: OtlpReceiver, fake_openai, send: bool
):
    from app.providers.openai_compatible import OpenAIEmbedder

    embedder = OpenAIEmbedder(
        base_url=fake_openai.base_url,
        api_key="sk-test-embedding-key",
        model="text-embedding-3-small",
        dimension=DEFAULT_DIMENSION,
        timeout_seconds=5.0,
        max_retries=0,
        send_traceparent=send,
    )
    try:
        with tracing.span("embed"):
            await embedder.embed(["조용한 카페"])
    finally:
        await embedder.aclose()
    tracing.shutdown()

    (sent,) = fake_openai.traceparents("embeddings")
    call = next(span for span in traced.spans if span.name == "provider embedding")
    assert call.attributes == {"pinlog.path": "embeddings"}
    if send:
        version, trace_id, span_id, flags = sent.split("-")
        assert (version, trace_id, span_id) == ("00", call.trace_id, call.span_id)
        assert int(flags, 16) & 1  # sampled
    else:
        assert sent is None


def test_a_bad_otlp_endpoint_is_a_configuration_error_naming_the_variable_not_the_value():
    from pydantic import ValidationError

    from core_service.settings import ENV_PREFIX, TracingSettings
    from pinlog_platform.settings_rules import OTLP_ENDPOINT_RULE, describe_errors

    for bad in ("collector:4318", "ftp://collector:4318", "http://collector:4318/?token=abc"):
        with pytest.raises(ValidationError) as raised:
            TracingSettings(otel_exporter_otlp_endpoint=bad)
        (line,) = describe_errors(raised.value, prefix=ENV_PREFIX)
        assert line == f"PINLOG_CORE_OTEL_EXPORTER_OTLP_ENDPOINT: {OTLP_ENDPOINT_RULE}"
    assert TracingSettings(otel_exporter_otlp_endpoint="http://collector:4318")
