"""A real OTLP/HTTP trace receiver for tests: ``POST /v1/traces`` with a protobuf
``ExportTraceServiceRequest`` body, decoded with ``opentelemetry-proto``.

Starlette + uvicorn in a background thread on ``127.0.0.1`` (like ``tests/fake_openai.py``);
the services export to it over TCP with their real exporter, so nothing is patched. Each span
is kept as a ``ReceivedSpan`` (ids as hex, as ``traceparent`` writes them); ``payloads`` keeps
every raw body, so a test can look for forbidden strings in everything that was exported
(protobuf stores strings as plain UTF-8).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span: ``service`` is its resource's ``service.name``; ids are hex
    (``parent_span_id`` empty for a root); ``links`` are ``(trace_id, span_id)`` pairs."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any] = field(default_factory=dict)
    links: tuple[tuple[str, str], ...] = ()
    events: tuple[str, ...] = ()


@contextlib.contextmanager
def exporting_to(receiver: OtlpReceiver) -> Iterator[OtlpReceiver]:
    """Tracing on in this process (``pinlog_platform.tracing``), every span sampled, exported
    to ``receiver`` (cleared first); off after. ``tracing.shutdown`` flushes: a test reads its
    spans after calling it."""
    from pinlog_platform import tracing

    receiver.clear()
    sampler = os.environ.get("OTEL_TRACES_SAMPLER")
    os.environ["OTEL_TRACES_SAMPLER"] = "always_on"
    try:
        assert tracing.configure("pinlog-test", receiver.endpoint)
        yield receiver
    finally:
        tracing.shutdown()
        if sampler is None:
            del os.environ["OTEL_TRACES_SAMPLER"]
        else:
            os.environ["OTEL_TRACES_SAMPLER"] = sampler


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


class OtlpReceiver:
    """``with OtlpReceiver() as receiver``: ``receiver.endpoint`` is the base URL the services
    are given (they POST to ``<endpoint>/v1/traces``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self._payloads: list[bytes] = []
        self._app = Starlette(routes=[Route("/v1/traces", self._traces, methods=["POST"])])
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.endpoint = ""

    def __enter__(self) -> OtlpReceiver:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        config = uvicorn.Config(self._app, lifespan="off", log_config=None, access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="otlp", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("OTLP receiver did not start")
            time.sleep(0.01)
        self.endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)

    @property
    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    @property
    def payloads(self) -> list[bytes]:
        with self._lock:
            return list(self._payloads)

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()
            self._payloads.clear()

    async def _traces(self, request: Request) -> Response:
        body = await request.body()
        if request.headers.get("content-type") != "application/x-protobuf":
            return Response(status_code=415)
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        spans = []
        for resource_spans in message.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(
                        ReceivedSpan(
                            service=resource.get("service.name", ""),
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            kind=span.kind,
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            links=tuple((k.trace_id.hex(), k.span_id.hex()) for k in span.links),
                            events=tuple(event.name for event in span.events),
                        )
                    )
        with self._lock:
            self._payloads.append(body)
            self._spans.extend(spans)
        return Response(
            ExportTraceServiceResponse().SerializeToString(),
            media_type="application/x-protobuf",
        )
