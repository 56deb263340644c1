"""Composition root: ``create_app()`` builds everything in the lifespan (STYLE practice 10).

Run with ``uvicorn --factory app.main:create_app`` or ``pinlog-ai serve``. Nothing imports
this module; no work happens at import time.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from app.api.routes import RETRY_AFTER_SECONDS, router
from app.api.security import InternalSecretMiddleware
from app.errors import (
    InvalidInputError,
    PermanentError,
    ProfileMismatchError,
    TransientError,
    WorkerError,
)
from app.metrics import WorkerMetrics
from app.providers.embedding_batcher import BatchingEmbedder
from app.providers.factory import build_embedding_provider, build_judge
from app.providers.metered import MeteredEmbedder, MeteredJudge
from app.repository.db import create_engine
from app.repository.stage_pool import StagePool
from app.service.circuit_breaker import CircuitBreaker
from app.service.embedding_stage import EmbeddingStage
from app.service.health import Readiness
from app.service.keyword_stage import KeywordStage
from app.service.presets import PresetCache
from app.service.processing import ContextProcessor
from app.service.search import SearchService
from app.service.stage_limits import StageLimits
from app.service.vector_columns import check_vector_columns
from app.service.worker_pool import WorkerPool
from app.settings import (
    SEARCH_CONNECTIONS,
    STAGE_CONNECTIONS_CAP,
    SUPPORT_CONNECTIONS,
    Settings,
)
from pinlog_platform.http.body_limit import BodySizeLimitMiddleware
from pinlog_platform.http.probes import probes
from pinlog_platform.http.request_timing import RequestTimingMiddleware
from pinlog_platform.http.validation import validation_error

logger = logging.getLogger(__name__)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the worker app; settings are read from the environment when not given.

    Startup raises ``ConfigurationError`` when no usable presets exist for the profile (§4)
    or the ai.* vector columns are not of ``Settings.vector_dimension`` (§5), and
    ``pydantic.ValidationError`` for contradictory or missing settings (§5).
    """
    settings = settings or Settings()
    # Built here, not in the lifespan: the request timing middleware needs it at construction.
    metrics = WorkerMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            _warn_about_a_small_pool(settings)
            # The stage statements (§3) run on a plain asyncpg pool; this engine serves the
            # preset cache and startup checks.
            stage_pool = await StagePool.open(
                settings.database_url,
                size=settings.pool_size,
                transaction_pooling=settings.database_transaction_pooling,
            )
            stack.push_async_callback(stage_pool.close)
            engine = create_engine(
                settings.database_url,
                pool_size=SUPPORT_CONNECTIONS,
                transaction_pooling=settings.database_transaction_pooling,
            )
            stack.push_async_callback(engine.dispose)
            # Readiness has its own connection: a busy or exhausted worker pool must not make
            # /readyz wait.
            probe_engine = create_engine(
                settings.database_url,
                pool_size=1,
                with_vector_codec=False,
                transaction_pooling=settings.database_transaction_pooling,
                pre_ping=True,
            )
            stack.push_async_callback(probe_engine.dispose)
            # Search has its own small pool, so a burst of stage work never queues it (§7).
            search_engine = create_engine(
                settings.database_url,
                pool_size=SEARCH_CONNECTIONS,
                transaction_pooling=settings.database_transaction_pooling,
            )
            stack.push_async_callback(search_engine.dispose)
            embedder = MeteredEmbedder(
                build_embedding_provider(settings),
                metrics.providers["embedding"],
                batch_inputs=metrics.embedding_batch_inputs,
            )
            stack.push_async_callback(embedder.aclose)
            # Concurrent embedding stages share provider requests; search is never delayed.
            stage_embedder = BatchingEmbedder(
                embedder,
                max_batch=settings.embedding_batch_size,
                max_wait_seconds=settings.embedding_batch_wait_ms / 1000,
            )
            stack.push_async_callback(stage_embedder.aclose)
            judge = MeteredJudge(build_judge(settings, metrics), metrics.providers["judge"])
            stack.push_async_callback(judge.aclose)
            # A column of another width would fail every save; refuse before serving (§5).
            await check_vector_columns(engine, settings.vector_dimension)
            presets = PresetCache(engine, settings.embedding_profile)
            await presets.reload()
            embedding_breaker = _breaker("embedding provider", settings, metrics)
            limits = StageLimits(
                expiry_seconds=settings.processing_expiry_seconds,
                max_input_chars=settings.embedding_max_input_chars,
            )
            processor = ContextProcessor(
                stage_pool,
                EmbeddingStage(
                    stage_pool,
                    stage_embedder,
                    embedding_breaker,
                    metrics=metrics,
                    limits=limits,
                    profile=settings.embedding_profile,
                    dimension=settings.vector_dimension,  # stored, zero-padded (§5)
                ),
                KeywordStage(
                    stage_pool,
                    judge,
                    _breaker("judge provider", settings, metrics),
                    presets,
                    metrics=metrics,
                    limits=limits,
                    top_k=settings.keyword_top_k,
                    similarity_floor=settings.keyword_similarity_floor,
                ),
                limits=limits,
                metrics=metrics,
            )
            pool = WorkerPool(
                processor.process,
                concurrency=settings.worker_concurrency,
                capacity=settings.queue_capacity,
                metrics=metrics,
            )
            pool.start()
            stack.push_async_callback(pool.stop, settings.shutdown_grace_seconds)
            app.state.pool = pool
            app.state.processor = processor
            app.state.presets = presets
            app.state.readiness = readiness = Readiness(
                probe_engine, presets, offline=settings.offline
            )
            stack.push_async_callback(readiness.aclose)
            app.state.engine = engine
            app.state.stage_pool = stage_pool
            app.state.search = SearchService(
                search_engine,
                embedder,
                embedding_breaker,
                metrics=metrics,
                profile=settings.embedding_profile,
                max_input_chars=limits.max_input_chars,
            )
            logger.info(
                "worker ready: mode=%s profile=%s judge=%s concurrency=%d",
                "offline" if settings.offline else "online",
                settings.embedding_profile,
                settings.judge_profile,
                settings.worker_concurrency,
            )
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
    # A middleware added later runs further out: the secret is checked before the body size,
    # so an unauthenticated caller learns nothing, not even the limit (§8).
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.max_request_bytes)
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
    # A transient failure tells the caller when to come back, like a full queue does.
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if status == 503 else None

    async def handler(_request: Request, exc: Exception) -> JSONResponse:
        # Messages of errors reaching a route are fixed strings naming the layer (§6).
        return JSONResponse({"detail": str(exc)}, status_code=status, headers=headers)

    return handler


def _warn_about_a_small_pool(settings: Settings) -> None:
    """A pool smaller than the worker tasks (up to the cap) plus spare makes tasks queue for
    connections (each wait counts against the stage deadline): allowed, but said once."""
    explicit = settings.database_pool_size
    if explicit is not None and explicit < settings.pool_size_needed:
        logger.warning(
            "PINLOG_DATABASE_POOL_SIZE=%d is below the %d connections that "
            "PINLOG_WORKER_CONCURRENCY=%d needs (one per worker task up to %d, plus %d spare); "
            "unset it to size the pool from the concurrency",
            explicit,
            settings.pool_size_needed,
            settings.worker_concurrency,
            STAGE_CONNECTIONS_CAP,
            SEARCH_CONNECTIONS,
        )


def _breaker(name: str, settings: Settings, metrics: WorkerMetrics) -> CircuitBreaker:
    return CircuitBreaker(
        name,
        metrics=metrics,
        threshold=settings.breaker_threshold,
        cooldown_seconds=settings.breaker_cooldown_seconds,
    )
