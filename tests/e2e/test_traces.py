"""Traces across both services as real processes, exported to a real OTLP/HTTP receiver
(``tests/otlp_receiver.py``): one note's spans form one trace from the core's client request
through its dispatch to the worker's claims, provider calls and saves; a client's own
``traceparent`` is linked, not continued; ``pinlog-core rescan --once`` starts a trace of its
own; no note text, query, token or secret is exported; the JSON log lines written inside a span
carry its ids; providers get no ``traceparent`` unless a setting says so."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import httpx
import pytest

from app.repository import keyword_preset
from tests.core.harness import JWT_SECRET, bearer, make_member
from tests.e2e.conftest import OWNER, CoreApi
from tests.e2e.observe import wait_finished, wait_until
from tests.e2e.processes import ServiceProcess, core_environment, run_command, worker_environment
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.worker.harness import SECRET

pytestmark = pytest.mark.processes

NOTE = "추적에 절대 나오면 안 되는 비밀 메모, 조용한 카페"
QUERY = "추적에 나오면 안 되는 검색어"
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
# Every sampler decision is "yes" (the default 0.1 ratio would make the test a lottery); spans
# leave each process within 50 ms instead of the batch processor's 5 s.
TRACE_ENVIRONMENT = {"OTEL_TRACES_SAMPLER": "always_on", "OTEL_BSP_SCHEDULE_DELAY": "50"}
# What a note's trace must hold from the worker: its request, the pool's run, the start's
# claim, both stages, both provider calls (stage side and HTTP side) and both saves.
WORKER_SPANS = {
    "POST /internal/v1/context/process",
    "process context",
    "start and claim embedding",
    "embedding stage",
    "embed",
    "provider embedding",
    "save embedding",
    "keyword stage",
    "judge",
    "provider judge",
    "save keywords",
}


@dataclass
class Traced:
    """The services, and what ``pinlog-core rescan --once`` exported, run beside their start:
    its exit code and stderr, and the spans of its service (exported at its exit)."""

    receiver: OtlpReceiver
    worker: ServiceProcess
    core: ServiceProcess
    rescan: tuple[int, str]
    rescan_spans: list[ReceivedSpan]


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


@pytest.fixture(scope="module")
async def traced(
    engine, migrated_database, bundled_preset_rows, fake_openai_server, receiver, tmp_path_factory
) -> AsyncIterator[Traced]:
    """Both services exporting traces to ``receiver``; the core without its rescan loop. A
    ``pinlog-core rescan --once`` runs while they start (a command's cost is its interpreter's
    start, paid once here instead of in a test)."""
    async with engine.begin() as conn:  # the worker caches presets at startup (§4)
        await keyword_preset.upsert_all(conn, bundled_preset_rows)
    logs = tmp_path_factory.mktemp("trace-logs")
    worker_env = worker_environment(
        migrated_database, fake_openai_server, otel_exporter_otlp_endpoint=receiver.endpoint
    )
    worker = ServiceProcess("app", worker_env | TRACE_ENVIRONMENT, logs / "worker.log")
    core_env = core_environment(
        migrated_database, worker.base_url, otel_exporter_otlp_endpoint=receiver.endpoint
    )
    core_env |= TRACE_ENVIRONMENT
    core = ServiceProcess("core_service", core_env, logs / "core.log", extra_args=("--no-rescan",))
    try:
        _, _, (code, _out, err) = await asyncio.gather(
            worker.start(),
            core.start(),
            run_command("core_service.cli", "rescan", "--once", env=core_env),
        )
        # The command's spans were exported at its exit, before run_command returned; no
        # serving process has a rescan loop, so "rescan pass" spans are the command's.
        rescan_spans = [
            s for s in receiver.spans if s.name in ("pinlog-core rescan", "rescan pass")
        ]
        yield Traced(receiver, worker, core, (code, err), rescan_spans)
    finally:
        await asyncio.gather(core.stop(), worker.stop())


@pytest.fixture
async def api(traced: Traced, engine, presets) -> AsyncIterator[CoreApi]:
    await make_member(engine, OWNER)
    traced.receiver.clear()
    async with httpx.AsyncClient(base_url=traced.core.base_url, timeout=30) as client:
        yield CoreApi(client)


def _in_trace(spans: list[ReceivedSpan], trace_id: str) -> list[ReceivedSpan]:
    return [span for span in spans if span.trace_id == trace_id]


def _forbidden() -> list[str]:
    """Strings no span may carry: the note, the query, the member's token, every secret."""
    token = bearer(OWNER)["Authorization"].removeprefix("Bearer ")
    return [NOTE, QUERY, token, JWT_SECRET, SECRET, "sk-test-embedding-key", "sk-test-judge-key"]


async def test_one_notes_spans_form_one_trace_across_both_services_and_carry_nothing_forbidden(
    traced: Traced, api: CoreApi, engine, fake_openai
):
    receiver = traced.receiver
    response = await api.client.post(
        "/api/v1/records",
        json={"externalPlaceId": "place-1", "placeName": "카페", "body": NOTE},
        headers=bearer(OWNER) | {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
    )
    assert response.status_code in (200, 201), response.text
    context_id = response.json()["contextId"]
    await wait_finished(engine, [context_id])
    searched = await api.client.post(
        "/api/v1/search", json={"query": QUERY, "limit": 5}, headers=bearer(OWNER)
    )
    assert searched.status_code == 200

    def created() -> ReceivedSpan | None:
        return next((s for s in receiver.spans if s.name == "POST /api/v1/records"), None)

    async def whole_trace_arrived() -> bool:
        root = created()
        names = {s.name for s in _in_trace(receiver.spans, root.trace_id)} if root else set()
        searches = {s.name for s in receiver.spans} & {"POST /api/v1/search"}
        return names >= WORKER_SPANS and bool(searches)

    await wait_until(whole_trace_arrived, within=10, what="the note's spans from both services")

    root = created()
    assert root is not None
    trace = _in_trace(receiver.spans, root.trace_id)
    # The client's traceparent is linked, not continued: the request starts our own trace.
    assert root.trace_id != CLIENT_TRACE
    assert root.parent_span_id == ""
    assert root.links == ((CLIENT_TRACE, CLIENT_SPAN),)
    assert root.attributes["http.route"] == "/api/v1/records"
    # One tree across both processes: every span but the root has its parent in the trace.
    assert {s.service for s in trace} == {"pinlog-core", "pinlog-ai"}
    ids = {s.span_id for s in trace}
    assert [s.name for s in trace if s.parent_span_id not in ids] == [root.name]
    worker_request = next(
        s
        for s in trace
        if (s.service, s.name) == ("pinlog-ai", "POST /internal/v1/context/process")
    )
    dispatch_call = next(s for s in trace if s.span_id == worker_request.parent_span_id)
    assert (dispatch_call.service, dispatch_call.name) == (
        "pinlog-core",
        "POST /internal/v1/context/process",
    )
    processed = next(s for s in trace if s.name == "process context")
    assert processed.attributes["pinlog.context_id"] == context_id

    exported = b"".join(receiver.payloads)
    for text in _forbidden():
        assert text.encode() not in exported, "a forbidden string was exported"
    for span in receiver.spans:
        carried = json.dumps([span.name, span.attributes, span.events], ensure_ascii=False)
        assert not any(text in carried for text in _forbidden())
    # Off by default: providers learn nothing of our traces.
    assert fake_openai.traceparents("embeddings")
    assert set(fake_openai.traceparents("embeddings") + fake_openai.traceparents("judge")) == {None}

    # The worker's JSON lines about this context, written inside its spans, name the trace.
    lines = [json.loads(line) for line in traced.worker.log().splitlines() if line[:1] == "{"]
    about = [line for line in lines if line.get("context_id") == context_id]
    assert about
    assert all(line.get("trace_id") == root.trace_id for line in about)
    assert all(line.get("span_id") in ids for line in about)


def test_a_rescan_command_starts_a_trace_of_its_own(traced: Traced):
    code, err = traced.rescan
    assert code == 0, err
    command = [s for s in traced.rescan_spans if s.name == "pinlog-core rescan"]
    assert len(command) == 1 and command[0].parent_span_id == ""
    assert command[0].service == "pinlog-core"
    passes = [s for s in traced.rescan_spans if s.name == "rescan pass"]
    assert [(s.trace_id, s.parent_span_id) for s in passes] == [
        (command[0].trace_id, command[0].span_id)
    ]
