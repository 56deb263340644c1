"""Traces of both services: OpenTelemetry spans exported over OTLP/HTTP, off unless configured.

``configure`` is called once per process by the CLI startup (``pinlog_platform.cli.startup``)
with the service's ``OTEL_EXPORTER_OTLP_ENDPOINT`` setting (``PINLOG_`` or ``PINLOG_CORE_``).
Without one nothing is created: no tracer provider, no span processor, no exporter, and the SDK
is not even imported. Every helper here then costs one ``is None`` check and creates no span
object (``span`` returns one shared no-op context manager).

With an endpoint, spans are batched and POSTed as protobuf to ``<endpoint>/v1/traces``. The
sampler is the standard ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` (read by the SDK);
unset, it is ``parentbased_traceidratio`` at 0.1 (``OTEL_TRACES_SAMPLER_ARG`` alone sets that
ratio). The batch processor reads the standard ``OTEL_BSP_*`` variables.

Propagation is W3C trace context (``traceparent``, ``tracestate``): ``outgoing_headers`` for
calls we make, ``TraceContextMiddleware`` for requests we serve. A request's incoming
``traceparent`` is continued when the caller is trusted (the worker's internal API, the core's
when ``PINLOG_CORE_OTEL_TRUST_CLIENT_TRACEPARENT``) and otherwise only linked: the server span
starts a trace of its own, so a client cannot steer our sampling or join our traces.

What spans carry (docs/operations.md "Traces"): names, context ids, stages, route templates,
methods, statuses, counts, a provider call's path, error class names. Never note text, a
query, a token, a secret, a URL with its query string, a header or an exception message: spans
are made here by hand (no auto-instrumentation of HTTP clients or ASGI, which records URLs and
headers), and exceptions are recorded by class name only.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)

TRACES_PATH = "/v1/traces"
DEFAULT_SAMPLE_RATIO = 0.1
SAMPLER_VARIABLE = "OTEL_TRACES_SAMPLER"
SAMPLER_ARG_VARIABLE = "OTEL_TRACES_SAMPLER_ARG"
# The only request headers read: the W3C trace context.
_TRACE_HEADERS = (b"traceparent", b"tracestate")
# The exporter's own deadline per POST (seconds): a slow collector delays only the export
# thread, never a request.
EXPORT_TIMEOUT_SECONDS = 10.0

# Set by ``configure``; ``None`` means tracing is off and every helper is a no-op.
_tracer: Tracer | None = None
_provider: TracerProvider | None = None
# W3C trace context only, whatever OTEL_PROPAGATORS says (no baggage read or sent).
_propagator: TraceContextTextMapPropagator | None = None
_NO_SPAN: contextlib.nullcontext[None] = contextlib.nullcontext()


def enabled() -> bool:
    """Whether this process exports traces."""
    return _tracer is not None


def configure(service_name: str, endpoint: str | None) -> bool:
    """Start exporting spans of ``service_name`` (``pinlog-core``, ``pinlog-ai``) to the
    OTLP/HTTP collector at ``endpoint`` (a base URL; spans go to ``<endpoint>/v1/traces``).
    ``endpoint=None``: tracing stays off and nothing is created. Returns whether tracing is on.
    A second call replaces the first (its spans are flushed)."""
    global _tracer, _provider, _propagator
    if not endpoint:
        return False
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    shutdown()
    provider = TracerProvider(
        resource=Resource.create({SERVICE_NAME: service_name}), sampler=_sampler()
    )
    provider.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(
                endpoint=endpoint.rstrip("/") + TRACES_PATH, timeout=EXPORT_TIMEOUT_SECONDS
            )
        )
    )
    _provider = provider
    _propagator = TraceContextTextMapPropagator()
    _tracer = provider.get_tracer("pinlog")
    logger.info("traces exported over OTLP/HTTP (service %s)", service_name)
    return True


def shutdown() -> None:
    """Flush and stop the exporter (waits for the batch in hand); tracing is off after."""
    global _tracer, _provider
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()


def _sampler():
    """The standard sampler variables, with ``parentbased_traceidratio`` at 0.1 by default."""
    from opentelemetry.sdk.trace.sampling import ParentBasedTraceIdRatio

    if os.environ.get(SAMPLER_VARIABLE, "").strip():
        return None  # the SDK reads OTEL_TRACES_SAMPLER and its argument itself
    ratio = DEFAULT_SAMPLE_RATIO
    argument = os.environ.get(SAMPLER_ARG_VARIABLE, "").strip()
    if argument:
        try:
            ratio = float(argument)
        except ValueError:
            logger.warning("%s is not a number; sampling ratio %g", SAMPLER_ARG_VARIABLE, ratio)
        if not 0.0 <= ratio <= 1.0:
            ratio = DEFAULT_SAMPLE_RATIO
            logger.warning("%s is outside 0..1; sampling ratio %g", SAMPLER_ARG_VARIABLE, ratio)
    return ParentBasedTraceIdRatio(ratio)


def span(
    name: str,
    *,
    parent: Context | None = None,
    new_trace: bool = False,
    kind: Literal["internal", "client"] = "internal",
    **attributes: str | int | float | bool,
) -> contextlib.AbstractContextManager[Span | None]:
    """A context manager around one span named ``name``, current inside it; the no-op
    ``nullcontext`` when tracing is off. ``parent``: a context captured by ``current_context``
    (work handed to another task); ``new_trace``: start a trace of its own (a loop's pass, a
    command); ``kind``: ``client`` for an outgoing call. ``attributes``: ids, counts, names,
    never user text or secrets, recorded as ``pinlog.<name>``. An exception leaving it marks the
    span as an error and names its class only."""
    tracer = _tracer
    if tracer is None:
        return _NO_SPAN
    from opentelemetry.trace import SpanKind

    if new_trace:
        from opentelemetry.context import Context

        parent = Context()
    span_kind = SpanKind.CLIENT if kind == "client" else SpanKind.INTERNAL
    named = {f"pinlog.{key}": value for key, value in attributes.items()}
    return _span(tracer, name, parent, named, kind=span_kind, links=())


@contextlib.contextmanager
def _span(
    tracer: Tracer,
    name: str,
    parent: Context | None,
    attributes: Mapping[str, Any],
    *,
    kind: Any,
    links: Sequence[Any],
) -> Iterator[Span]:
    from opentelemetry.trace import StatusCode

    with tracer.start_as_current_span(
        name,
        context=parent,
        kind=kind,
        attributes=attributes,
        links=links,
        # Exception messages may quote input: the class name only, below.
        record_exception=False,
        set_status_on_exception=False,
    ) as current:
        try:
            yield current
        except BaseException as exc:
            current.set_attribute("error.type", type(exc).__qualname__)
            current.set_status(StatusCode.ERROR)
            raise


def current_context() -> Context | None:
    """The current trace context, to hand to work another task runs (``span(parent=...)``);
    ``None`` when tracing is off."""
    if _tracer is None:
        return None
    from opentelemetry.context import get_current

    return get_current()


def outgoing_headers() -> dict[str, str] | None:
    """``traceparent`` (and ``tracestate``) of the current span for an outgoing request;
    ``None`` when tracing is off or no span is current."""
    propagator = _propagator
    if _tracer is None or propagator is None:
        return None
    carrier: dict[str, str] = {}
    propagator.inject(carrier)
    return carrier or None


def current_ids() -> tuple[str, str] | None:
    """``(trace_id, span_id)`` of the current span as lower-case hex (32 and 16 digits), the
    way the W3C header writes them; ``None`` when tracing is off or no span is current."""
    if _tracer is None:
        return None
    from opentelemetry.trace import get_current_span

    context = get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


class TraceContextMiddleware:
    """Pure ASGI middleware: one server span per HTTP request, named ``<METHOD> <route
    template>`` (never the raw path, which may carry a query string), with the method, route
    template and status. ``trust_incoming``: continue the caller's ``traceparent``; otherwise
    the span starts its own trace and links to the caller's. A no-op when tracing is off."""

    def __init__(self, app: ASGIApp, *, trust_incoming: bool) -> None:
        self._app = app
        self._trust_incoming = trust_incoming

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        tracer = _tracer
        if tracer is None or scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        from opentelemetry.context import Context
        from opentelemetry.trace import Link, SpanKind, get_current_span

        carrier = {
            key.decode("latin-1"): value.decode("latin-1")
            for key, value in scope["headers"]
            if key in _TRACE_HEADERS
        }
        incoming = _propagator.extract(carrier) if carrier and _propagator else None
        parent, links = Context(), []
        if incoming is not None:
            caller = get_current_span(incoming).get_span_context()
            if self._trust_incoming:
                parent = incoming
            elif caller.is_valid:
                links.append(Link(caller))
        method = scope["method"]
        status = 500

        async def send_noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        with _span(
            tracer,
            method,
            parent,
            {"http.request.method": method},
            kind=SpanKind.SERVER,
            links=links,
        ) as server_span:
            try:
                await self._app(scope, receive, send_noting_status)
            finally:
                route = getattr(scope.get("route"), "path", None)
                if route is not None:
                    server_span.update_name(f"{method} {route}")
                    server_span.set_attribute("http.route", route)
                server_span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    from opentelemetry.trace import StatusCode

                    server_span.set_status(StatusCode.ERROR)
