"""The core service's HTTP side: ``create_app()`` wires routes, middleware, ``/readyz`` and the
one table mapping errors to HTTP statuses; its lifespan enters ``build_core``
(``core_service/composition.py``), which builds everything else.

Run with ``pinlog-core serve`` (or ``uvicorn --factory core_service.main:create_app``).
The rescan loop runs inside the service; ``pinlog-core rescan --once`` runs one pass.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import text

from core_service.api.routes import router
from core_service.composition import Core, build_core
from core_service.errors import (
    ConflictError,
    CoreError,
    InvalidBodyError,
    InvalidCursorError,
    NotFoundError,
    UnauthenticatedError,
    UnavailableError,
    UpstreamError,
)
from core_service.metrics import CoreMetrics
from core_service.settings import CoreSettings
from pinlog_platform.db.engines import ACCEPTS_WRITES as ACCEPTS_WRITES_SQL
from pinlog_platform.http.body_limit import BodySizeLimitMiddleware
from pinlog_platform.http.probes import probes
from pinlog_platform.http.request_deadline import RequestDeadlineMiddleware
from pinlog_platform.http.request_timing import RequestTimingMiddleware
from pinlog_platform.http.validation import validation_error

logger = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = "5"
ACCEPTS_WRITES = text(ACCEPTS_WRITES_SQL)
OPENAPI_PATH = "/api/v1/openapi.json"
READINESS_TIMEOUT_SECONDS = 1.0


def create_app(settings: CoreSettings | None = None, *, run_rescan_loop: bool = True) -> FastAPI:
    """Build the core service. ``run_rescan_loop=False`` leaves rescans to the caller (tests,
    deployments that run ``pinlog-core rescan --once`` from a scheduler instead)."""
    settings = settings or CoreSettings()
    metrics = CoreMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with build_core(settings, metrics, run_rescan_loop=run_rescan_loop) as core:
            _publish(app, core)
            yield

    # No /docs or /redoc: the pages load their assets from a CDN (blank offline). The OpenAPI
    # document is docs/openapi/core-client.json, served only with PINLOG_CORE_SERVE_OPENAPI.
    app = FastAPI(
        title="PinLog core service",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=OPENAPI_PATH if settings.serve_openapi else None,
    )
    app.state.metrics = metrics
    app.state.metrics_registry = metrics.registry
    app.include_router(probes)
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
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(CoreError, _core_error)

    @app.get("/readyz")
    async def readyz(request: Request) -> JSONResponse:
        """Readiness: the database answers within 1 s and accepts writes (not while the
        server is read-only, e.g. a standby after a failover)."""
        try:
            async with asyncio.timeout(READINESS_TIMEOUT_SECONDS):
                async with request.app.state.probe_engine.connect() as conn:
                    writable = (await conn.execute(ACCEPTS_WRITES)).scalar()
        except Exception:
            writable = False
        if not writable:
            return JSONResponse(
                {"status": "unavailable", "problems": ["database"]}, status_code=503
            )
        return JSONResponse({"status": "ready"})

    return app


# The one place mapping the core's errors to HTTP statuses; anything else is a bug: 500.
_ERROR_STATUSES: tuple[tuple[type[CoreError], int], ...] = (
    (InvalidBodyError, 422),
    (InvalidCursorError, 422),
    (UnauthenticatedError, 401),
    (NotFoundError, 404),
    (ConflictError, 409),
    (UpstreamError, 502),
    (UnavailableError, 503),
)


async def _core_error(_request: Request, exc: Exception) -> JSONResponse:
    for error_class, status in _ERROR_STATUSES:
        if isinstance(exc, error_class):
            headers = {}
            if status == 401:
                headers["WWW-Authenticate"] = "Bearer"
            elif status == 503:
                headers["Retry-After"] = RETRY_AFTER_SECONDS
            return JSONResponse({"detail": str(exc)}, status_code=status, headers=headers)
    # DatabaseFault and anything unmapped: a bug of ours. The message names only a SQLSTATE.
    logger.error("internal error: %s: %s", type(exc).__name__, exc)
    return JSONResponse({"detail": "internal error"}, status_code=500)


def _publish(app: FastAPI, core: Core) -> None:
    """Each part of ``core`` as ``app.state.<field>``, where the routes' dependencies
    (``core_service/api/dependencies.py``) and ``/readyz`` find them."""
    for field in dataclasses.fields(core):
        setattr(app.state, field.name, getattr(core, field.name))
