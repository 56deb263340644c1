"""Composition root of the core service: ``create_app()`` builds everything in the lifespan.

Run with ``pinlog-core serve`` (or ``uvicorn --factory core_service.main:create_app``).
The rescan loop runs inside the service; ``pinlog-core rescan --once`` runs one pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import text

from core_service.api.routes import router
from core_service.errors import (
    ConflictError,
    CoreError,
    InvalidBodyError,
    NotFoundError,
    UnauthenticatedError,
    UnavailableError,
    UpstreamError,
)
from core_service.metrics import CoreMetrics
from core_service.repository.context_ai_state import Expiries
from core_service.repository.db import create_engine
from core_service.service.dispatch import WorkerDispatcher
from core_service.service.lifecycle import ContextLifecycle
from core_service.service.member_tokens import TokenAuthenticator
from core_service.service.pause import PauseSwitch
from core_service.service.personal_search import PersonalSearch
from core_service.service.process_requests import ProcessRequestSender
from core_service.service.record_reads import RecordReader
from core_service.service.rescan import RescanScheduler
from core_service.service.status import StatusGauges
from core_service.service.worker_endpoints import WorkerEndpoints
from core_service.settings import CoreSettings
from pinlog_platform.http.body_limit import BodySizeLimitMiddleware
from pinlog_platform.http.probes import probes
from pinlog_platform.http.request_timing import RequestTimingMiddleware
from pinlog_platform.http.validation import validation_error

logger = logging.getLogger(__name__)

# Seconds that in-flight after-commit dispatches get at shutdown; the rest are left to the rescan.
DISPATCH_DRAIN_SECONDS = 2.0
RETRY_AFTER_SECONDS = "5"
# Seconds the rescan loop gets to finish its pass at shutdown before it is cancelled.
RESCAN_STOP_SECONDS = 2.0
READINESS_TIMEOUT_SECONDS = 1.0


def build_worker_endpoints(settings: CoreSettings) -> WorkerEndpoints:
    """One pooled HTTP client per worker instance named in ``WORKER_BASE_URL``."""
    return WorkerEndpoints.connect(
        settings.worker_base_urls,
        internal_secret=settings.internal_secret.get_secret_value(),
        connect_timeout_seconds=settings.dispatch_connect_timeout_seconds,
        read_timeout_seconds=settings.dispatch_read_timeout_seconds,
    )


def attempt_deadline(settings: CoreSettings) -> float:
    """Seconds one dispatch attempt may take in all: connect, send, and read the answer."""
    return settings.dispatch_connect_timeout_seconds + settings.dispatch_read_timeout_seconds + 1


def build_dispatcher(
    settings: CoreSettings,
    engine,
    endpoints: WorkerEndpoints,
    metrics: CoreMetrics,
    pause: PauseSwitch | None = None,
) -> WorkerDispatcher:
    """The dispatcher to the worker instances, counting dispatches against ``MAX_RETRY`` and
    holding refused ones (its loop runs once ``start`` is called)."""
    return WorkerDispatcher(
        ProcessRequestSender(endpoints, attempt_deadline_seconds=attempt_deadline(settings)),
        metrics,
        engine,
        max_retry=settings.max_retry,
        pending_expiry_seconds=settings.pending_expiry_seconds,
        retry_capacity=settings.dispatch_retry_capacity,
        backoff_max_seconds=settings.dispatch_backoff_max_seconds,
        pause=pause or PauseSwitch(engine, metrics),
    )


def build_scheduler(settings: CoreSettings, engine, dispatcher, metrics) -> RescanScheduler:
    return RescanScheduler(
        engine,
        dispatcher,
        metrics,
        expiries=Expiries(settings.pending_expiry_seconds, settings.processing_expiry_seconds),
        max_retry=settings.max_retry,
        batch_size=settings.batch_size,
        period_seconds=settings.rescan_period_seconds,
    )


def create_app(settings: CoreSettings | None = None, *, run_rescan_loop: bool = True) -> FastAPI:
    """Build the core service. ``run_rescan_loop=False`` leaves rescans to the caller (tests,
    deployments that run ``pinlog-core rescan --once`` from a scheduler instead)."""
    settings = settings or CoreSettings()
    metrics = CoreMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            engine = create_engine(
                settings.database_url,
                pool_size=settings.database_pool_size,
                transaction_pooling=settings.database_transaction_pooling,
            )
            stack.push_async_callback(engine.dispose)
            endpoints = build_worker_endpoints(settings)
            stack.push_async_callback(endpoints.aclose)
            app.state.pause = PauseSwitch(engine, metrics)
            dispatcher = build_dispatcher(settings, engine, endpoints, metrics, app.state.pause)
            dispatcher.start()
            stack.push_async_callback(dispatcher.close, DISPATCH_DRAIN_SECONDS)
            # Readiness on a connection of its own: a busy request pool must not fail /readyz.
            probe_engine = create_engine(
                settings.database_url,
                pool_size=1,
                transaction_pooling=settings.database_transaction_pooling,
            )
            stack.push_async_callback(probe_engine.dispose)
            app.state.probe_engine = probe_engine
            app.state.engine = engine
            app.state.dispatcher = dispatcher
            app.state.lifecycle = ContextLifecycle(engine, dispatcher, metrics)
            app.state.reader = RecordReader(engine)
            app.state.search = PersonalSearch(
                engine, endpoints, embedding_profile=settings.embedding_profile
            )
            app.state.authenticator = TokenAuthenticator(
                engine, secret=settings.jwt_secret.get_secret_value()
            )
            gauges = StatusGauges(
                engine,
                metrics,
                processing_expiry_seconds=settings.processing_expiry_seconds,
                period_seconds=settings.status_refresh_seconds,
            )
            stack.push_async_callback(_stop_task, *_start(gauges.run_forever))
            if run_rescan_loop:
                # A pass waiting on a slow worker must not hold shutdown: its claimed rows stay
                # stale and the next pass (any replica) takes them again.
                scheduler = build_scheduler(settings, engine, dispatcher, metrics)
                stack.push_async_callback(_stop_task, *_start(scheduler.run_forever))
            logger.info(
                "core service ready: worker=%s rescan every %gs",
                settings.worker_base_url,
                settings.rescan_period_seconds,
            )
            yield

    # No /docs, /redoc or /openapi.json: the schema is in docs/core-service.md, and the docs
    # pages load their assets from a CDN (blank offline).
    app = FastAPI(
        title="PinLog core service",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.state.metrics = metrics
    app.state.metrics_registry = metrics.registry
    app.include_router(probes)
    app.include_router(router)
    # Added before the timing middleware, so inside it: a 413 is counted like any answer.
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.max_request_bytes)

    # Outermost: requests refused before routing (a declared 413) are timed too.
    app.add_middleware(RequestTimingMiddleware, histogram=metrics.http_requests)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(CoreError, _core_error)

    @app.get("/readyz")
    async def readyz(request: Request) -> JSONResponse:
        """Readiness: the database answers within 1 s. ``dispatch`` says whether dispatching is
        paused; a pause keeps 200 (the client API still works)."""
        try:
            async with asyncio.timeout(READINESS_TIMEOUT_SECONDS):
                async with request.app.state.probe_engine.connect() as conn:
                    await conn.execute(text("SELECT 1"))
        except Exception:
            return JSONResponse(
                {"status": "unavailable", "problems": ["database"]}, status_code=503
            )
        paused = await request.app.state.pause.paused()
        return JSONResponse({"status": "ready", "dispatch": "paused" if paused else "running"})

    return app


def _start(run_forever) -> tuple[asyncio.Event, asyncio.Task[None]]:
    """Start ``run_forever(stop)`` as a task; its stop event and the task."""
    stop = asyncio.Event()
    return stop, asyncio.create_task(run_forever(stop))


async def _stop_task(stop: asyncio.Event, task: asyncio.Task[None]) -> None:
    """Set ``stop``, give the task ``RESCAN_STOP_SECONDS`` to end, then cancel it."""
    stop.set()
    done, _ = await asyncio.wait({task}, timeout=RESCAN_STOP_SECONDS)
    if not done:
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


# The one place mapping the core's errors to HTTP statuses; anything else is a bug: 500.
_ERROR_STATUSES: tuple[tuple[type[CoreError], int], ...] = (
    (InvalidBodyError, 422),
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
