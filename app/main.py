"""The worker's HTTP side: ``create_app()`` wires routes, middleware and the one table mapping
errors to HTTP statuses; its lifespan enters ``build_worker`` (``app/composition.py``), which
builds everything else (STYLE practice 10).

Run with ``uvicorn --factory app.main:create_app`` or ``pinlog-ai serve``. Nothing imports
this module but the commands that serve; no work happens at import time.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import exc as sa_exc

from app.api.routes import RETRY_AFTER_SECONDS, router
from app.api.security import InternalSecretMiddleware
from app.composition import Worker, build_worker
from app.errors import (
    DatabaseStatementError,
    InvalidInputError,
    PermanentError,
    ProfileMismatchError,
    TransientError,
    WorkerError,
)
from app.metrics import WorkerMetrics
from app.settings import Settings
from pinlog_platform import tracing
from pinlog_platform.db.sqlstates import sqlstate
from pinlog_platform.http.body_limit import BodySizeLimitMiddleware
from pinlog_platform.http.probes import probes
from pinlog_platform.http.request_deadline import RequestDeadlineMiddleware
from pinlog_platform.http.request_timing import RequestTimingMiddleware
from pinlog_platform.http.validation import validation_error

logger = logging.getLogger(__name__)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the worker app; settings are read from the environment when not given.

    Startup raises what ``build_worker`` raises (``ConfigurationError``: no usable presets for
    the profile, §4, or vector columns of another width, §5); ``pydantic.ValidationError``
    here for contradictory or missing settings (§5).
    """
    settings = settings or Settings()
    # Built here, not in the lifespan: the request timing middleware needs it at construction.
    metrics = WorkerMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with build_worker(settings, metrics) as worker:
            _publish(app, worker)
            # Everything built so far lives as long as the process: moved out of the cyclic
            # collector's sight, a full collection no longer walks it, which would stall the
            # event loop (accept and search latency) for milliseconds at a time.
            gc.collect()
            gc.freeze()
            try:
                yield
            finally:
                gc.unfreeze()  # an app built again in this process (tests) starts clean

    # No /docs, /redoc or /openapi.json: an internal service has no public schema, and the docs
    # pages load their assets from a CDN (blank offline).
    app = FastAPI(
        title="PinLog AI worker", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.metrics = metrics
    app.state.metrics_registry = metrics.registry
    app.include_router(probes)
    app.include_router(router)
    app.add_exception_handler(RequestValidationError, validation_error)
    for error_class, status in _ERROR_STATUSES.items():
        app.add_exception_handler(error_class, _worker_error(status))
    for error_class in (sa_exc.SQLAlchemyError, DatabaseStatementError):
        app.add_exception_handler(error_class, _database_fault)
    # A middleware added later runs further out: the secret is checked before the body size,
    # so an unauthenticated caller learns nothing, not even the limit (§8).
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.max_request_bytes)
    # Every request ends within REQUEST_TIMEOUT_SECONDS (503 + Retry-After).
    app.add_middleware(
        RequestDeadlineMiddleware,
        seconds=settings.request_timeout_seconds,
        retry_after=str(RETRY_AFTER_SECONDS),
        on_expiry=metrics.request_deadlines.inc,
    )
    if tracing.enabled():
        # Inside the secret check: only a caller holding the secret (the core) continues its
        # trace here; without tracing the middleware is not even there.
        app.add_middleware(tracing.TraceContextMiddleware, trust_incoming=True)
    app.add_middleware(InternalSecretMiddleware, secret=settings.internal_secret.get_secret_value())
    # Outermost of all: requests refused before routing (401, a declared 413) are timed too.
    app.add_middleware(RequestTimingMiddleware, histogram=metrics.http_requests)
    return app


# The one place mapping our errors to HTTP statuses on request paths (§6); the most specific
# class wins. Anything else is a bug of ours: 500.
_ERROR_STATUSES: dict[type[WorkerError], int] = {
    ProfileMismatchError: 422,
    InvalidInputError: 422,
    PermanentError: 502,
    TransientError: 503,
}


def _worker_error(status: int):
    # A transient failure tells the caller when to come back, like a full queue does: an
    # unavailable provider's gate knows when it probes next (``ProviderGateClosed``).

    async def handler(_request: Request, exc: Exception) -> JSONResponse:
        headers = None
        if status == 503:
            retry_after = getattr(exc, "retry_after_seconds", None) or RETRY_AFTER_SECONDS
            headers = {"Retry-After": str(retry_after)}
        # Messages of errors reaching a route are fixed strings naming the layer (§6).
        return JSONResponse({"detail": str(exc)}, status_code=status, headers=headers)

    return handler


async def _database_fault(_request: Request, exc: Exception) -> JSONResponse:
    """A database error no translation claimed on a request path: a bug of ours, HTTP 500 with
    one ERROR line naming its class and SQLSTATE only (the driver's message can quote the
    statement's parameters: a note, a vector), never a traceback."""
    if isinstance(exc, DatabaseStatementError):  # its message names only its SQLSTATE
        logger.error("internal error: %s", exc)
    else:
        logger.error(
            "internal error: %s (SQLSTATE %s)", type(exc).__name__, sqlstate(exc) or "unknown"
        )
    return JSONResponse({"detail": "internal error"}, status_code=500)


def _publish(app: FastAPI, worker: Worker) -> None:
    """Each part of ``worker`` as ``app.state.<field>``, where the routes' dependencies
    (``app/api/routes.py``) find the pool, readiness and search."""
    for field in dataclasses.fields(worker):
        setattr(app.state, field.name, getattr(worker, field.name))
    metrics = app.state.metrics

    async def before_scrape() -> None:
        await worker.readiness.export_gauges(metrics)

    app.state.before_scrape = before_scrape
