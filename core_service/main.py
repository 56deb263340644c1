"""The core service's HTTP side: ``create_app()`` wires routes, middleware, ``/readyz`` and the
one table mapping errors to HTTP statuses; its lifespan enters ``build_core``
(``core_service/composition.py``), which builds everything else.

Run with ``pinlog-core serve`` (or ``uvicorn --factory core_service.main:create_app``).
The rescan loop runs inside the service; ``pinlog-core rescan --once`` runs one pass.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from core_service.api.responses import NOT_READY, ok
from core_service.api.routes import router
from core_service.api.security_headers import SecurityHeadersMiddleware
from core_service.composition import Core, build_core
from core_service.errors import (
    ConflictError,
    CoreError,
    InvalidRequestError,
    NotFoundError,
    RateLimitedError,
    UnauthenticatedError,
    UnavailableError,
    UpstreamError,
)
from core_service.metrics import CoreMetrics
from core_service.operations_listener import bind_ops_socket, readiness_problems, serving_ops
from core_service.settings import CoreSettings
from pinlog_platform import tracing
from pinlog_platform.http.body_limit import BodySizeLimitMiddleware
from pinlog_platform.http.json_response import OrjsonResponse
from pinlog_platform.http.probes import liveness
from pinlog_platform.http.request_deadline import RequestDeadlineMiddleware
from pinlog_platform.http.request_timing import RequestTimingMiddleware
from pinlog_platform.http.validation import INVALID_REQUEST, error_items

logger = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = "5"
OPENAPI_PATH = "/api/v1/openapi.json"


def create_app(
    settings: CoreSettings | None = None,
    *,
    run_rescan_loop: bool = True,
    run_backfill_loop: bool = True,
    ops_socket: socket.socket | None = None,
) -> FastAPI:
    """Build the core service. ``run_rescan_loop=False`` leaves rescans to the caller (tests,
    deployments that run ``pinlog-core rescan --once`` from a scheduler instead); the
    re-embedding backfill loop runs regardless (``pinlog-core serve`` always runs it;
    ``run_backfill_loop=False`` is for tests that drive passes themselves).

    ``ops_socket``: the operations listener's socket, bound by the caller (``pinlog-core serve``
    binds it before anything else, so a port in use exits 2); when ``None`` and
    ``settings.ops_port`` is set, the lifespan binds it. ``app.state.ops_base_url`` is its URL
    once started, else ``None`` (``core_service/operations_listener.py``).
    """
    settings = settings or CoreSettings()
    metrics = CoreMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        sock = ops_socket
        if sock is None and settings.ops_port is not None:
            sock = bind_ops_socket(settings.ops_host, settings.ops_port)
        async with build_core(
            settings,
            metrics,
            run_rescan_loop=run_rescan_loop,
            run_backfill_loop=run_backfill_loop,
        ) as core:
            _publish(app, core)
            async with serving_ops(app, sock) as ops_base_url:
                app.state.ops_base_url = ops_base_url
                yield

    # No /docs or /redoc: the pages load their assets from a CDN (blank offline). The OpenAPI
    # document is docs/openapi/core-client.json, served only with PINLOG_CORE_SERVE_OPENAPI.
    app = FastAPI(
        title="PinLog core service",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=OPENAPI_PATH if settings.serve_openapi else None,
        # No trailing-slash redirects: their Location would be built from the Host header.
        redirect_slashes=False,
    )
    app.openapi = partial(_documented_answers_only, app)  # type: ignore[method-assign]
    app.state.metrics = metrics
    app.state.metrics_registry = metrics.registry
    app.state.ops_base_url = None
    # Public: liveness only; /metrics and the detailed /readyz are on the ops listener.
    app.include_router(liveness)
    app.include_router(router)
    # Added before the timing middleware, so inside it: a 413 is counted like any answer.
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.max_request_bytes)
    # Every request ends within request_timeout_seconds (503 + Retry-After), except one that
    # has begun to commit (docs/deployment.md, "Deadlines").
    app.add_middleware(
        RequestDeadlineMiddleware,
        seconds=settings.request_timeout_seconds,
        retry_after=RETRY_AFTER_SECONDS,
        on_expiry=metrics.request_deadlines.inc,
        on_commit_unknown=metrics.commits_outcome_unknown.inc,
    )

    # Outermost: requests refused before routing (a declared 413) are timed too.
    app.add_middleware(RequestTimingMiddleware, histogram=metrics.http_requests)
    # Around everything, so a 413 or a 500 carries them too.
    app.add_middleware(SecurityHeadersMiddleware, private_prefixes=(router.prefix,))
    if tracing.enabled():
        # Outermost: every answer is in the request's span. A client's traceparent is only
        # linked unless trusted (PINLOG_CORE_OTEL_TRUST_CLIENT_TRACEPARENT); without tracing
        # the middleware is not even there.
        app.add_middleware(
            tracing.TraceContextMiddleware,
            trust_incoming=settings.otel_trust_client_traceparent,
        )
    app.add_exception_handler(RequestValidationError, _path_or_body_error)
    app.add_exception_handler(CoreError, _core_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)

    @app.get("/readyz", responses={**ok(200, "Ready", {"status": "ready"}), **NOT_READY})
    async def readyz(request: Request) -> OrjsonResponse:
        """Readiness, public: ready or not, without reasons (those are on the ops listener)."""
        if await readiness_problems(request.app.state.probe_engine):
            return OrjsonResponse({"status": "unavailable"}, status_code=503)
        return OrjsonResponse({"status": "ready"})

    return app


# The one place mapping the core's errors to HTTP statuses; anything else is a bug: 500.
# Every answer is {"detail": string} (docs/core-service.md "Errors"); a 422 adds "errors".
_ERROR_STATUSES: tuple[tuple[type[CoreError], int], ...] = (
    (InvalidRequestError, 422),
    (UnauthenticatedError, 401),
    (RateLimitedError, 429),
    (NotFoundError, 404),
    (ConflictError, 409),
    (UpstreamError, 502),
    (UnavailableError, 503),
)


async def _core_error(_request: Request, exc: Exception) -> OrjsonResponse:
    for error_class, status in _ERROR_STATUSES:
        if isinstance(exc, error_class):
            headers = {}
            if status == 401:
                headers["WWW-Authenticate"] = "Bearer"
            elif status == 503:
                headers["Retry-After"] = RETRY_AFTER_SECONDS
            elif isinstance(exc, RateLimitedError):
                headers["Retry-After"] = str(exc.retry_after_seconds)
            body: dict[str, object] = {"detail": str(exc)}
            if isinstance(exc, InvalidRequestError):
                item = {"loc": list(exc.loc), "msg": str(exc), "type": "value_error"}
                body = {"detail": INVALID_REQUEST, "errors": [item]}
            if isinstance(exc, ConflictError) and exc.replaced_by is not None:
                body["replacedBy"] = exc.replaced_by
            return OrjsonResponse(body, status_code=status, headers=headers)
    # DatabaseFault and anything unmapped: a bug of ours. The message names only a SQLSTATE.
    logger.error("internal error: %s: %s", type(exc).__name__, exc)
    return OrjsonResponse({"detail": "internal error"}, status_code=500)


# A path id that is not canonical names nothing: the not-found answer of that resource.
_PATH_RESOURCES = {"record_id": "record", "context_id": "context", "public_id": "record"}


async def _path_or_body_error(request: Request, exc: Exception) -> OrjsonResponse:
    """422 for a body or query that fails validation; 404 for a path id that is not
    canonical ASCII decimal within BIGINT (or a public id not of its form), with the body a
    missing resource gets, so that ``1_0`` or ``01`` reveals nothing the id ``10`` or ``1``
    would not."""
    assert isinstance(exc, RequestValidationError)
    for error in exc.errors():
        location = tuple(error.get("loc", ()))
        if location[:1] == ("path",):
            what = _PATH_RESOURCES.get(str(location[1]) if len(location) > 1 else "", "resource")
            return await _core_error(request, NotFoundError(what))
    return OrjsonResponse({"detail": INVALID_REQUEST, "errors": error_items(exc)}, status_code=422)


async def _http_error(_request: Request, exc: Exception) -> OrjsonResponse:
    """Starlette's own answers (an unknown path 404, 405, a body cut off at the cap 413, a
    body that cannot be parsed 400) in the shape and bytes of every other answer:
    ``{"detail": string}`` rendered by ``OrjsonResponse``, with the exception's headers
    (405's ``Allow``)."""
    assert isinstance(exc, StarletteHTTPException)
    return OrjsonResponse(
        {"detail": exc.detail}, status_code=exc.status_code, headers=dict(exc.headers or {})
    )


def _documented_answers_only(app: FastAPI) -> dict[str, Any]:
    """The OpenAPI document without the 422 FastAPI adds to every route with a parameter: a
    path id that is not canonical answers 404 here (``_path_or_body_error``), so a route
    answers 422 only where ``core_service/api/responses.py`` says so, in the core's own
    shape."""
    if app.openapi_schema is None:
        document = FastAPI.openapi(app)
        for operations in document.get("paths", {}).values():
            for operation in operations.values():
                answer = operation.get("responses", {}).get("422", {})
                schema = answer.get("content", {}).get("application/json", {}).get("schema", {})
                if schema.get("$ref", "").endswith("/HTTPValidationError"):
                    del operation["responses"]["422"]
        schemas = document.get("components", {}).get("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        app.openapi_schema = document
    return app.openapi_schema


def _publish(app: FastAPI, core: Core) -> None:
    """Each part of ``core`` as ``app.state.<field>``, where the routes' dependencies
    (``core_service/api/dependencies.py``) and ``/readyz`` find them."""
    for field in dataclasses.fields(core):
        setattr(app.state, field.name, getattr(core, field.name))
