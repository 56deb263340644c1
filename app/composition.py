"""The worker's object graph: ``build_worker`` opens every pool, provider and service, starts
the worker pool, and closes everything in reverse when it exits (STYLE practice 10).

``app/main.py`` enters it in the FastAPI lifespan; nothing here knows about HTTP. No work
happens at import time.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from app import failure_policy
from app.metrics import WorkerMetrics
from app.providers.base import EmbeddingProvider, KeywordJudge
from app.providers.openai_batches import BatchClient
from app.providers.usage import StageTagged
from app.repository.db import command_timeout_for, create_engine
from app.repository.stage_pool import StagePool
from app.service.batch_backfill import BatchBackfill
from app.service.embedding_stage import EmbeddingStage
from app.service.health import Readiness
from app.service.keyword_batches import KeywordBatches
from app.service.keyword_stage import KeywordStage
from app.service.presets import PresetCache
from app.service.processing import ContextProcessor
from app.service.profile_backfill import ProfileBackfill
from app.service.provider_assembly import open_providers
from app.service.provider_gate import ProviderGate, ProviderRefusalPolicy
from app.service.search import SearchService
from app.service.stage_limits import StageLimits
from app.service.usage_ledger import UsageLedger
from app.service.vector_columns import check_vector_columns
from app.service.worker_pool import WorkerPool
from app.settings import (
    SEARCH_CONNECTIONS,
    STAGE_CONNECTIONS_CAP,
    SUPPORT_CONNECTIONS,
    Settings,
)
from pinlog_platform.contract.search import SearchCuts

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Worker:
    """What one worker process serves with, from startup to shutdown.

    ``stage_pool``: the plain asyncpg pool of the stage statements (§3); ``engine``: the preset
    cache's and startup checks' engine; ``pool``: the worker tasks behind
    ``POST /internal/v1/context/process``; ``processor``: §3 for one request; ``readiness`` and
    ``search`` answer ``/readyz`` and ``POST /internal/v1/search`` on engines of their own;
    ``gates``: each provider's gate by name (``embedding``, ``judge``), the one place deciding
    "provider unavailable"; ``provider_refusals``: whether process requests are refused
    meanwhile; ``backfill``: ``POST /internal/v1/backfill/embed`` (re-embedding); ``batches``:
    the same by the provider's Batch API and the poller of this profile's open batches
    (``None`` when the provider has no Batch API); ``keyword_batches``: a keyword
    reprocess's judgments by the judge provider's Batch API and their poller (``None`` when
    it has none).
    """

    stage_pool: StagePool
    engine: AsyncEngine
    pool: WorkerPool
    processor: ContextProcessor
    presets: PresetCache
    readiness: Readiness
    search: SearchService
    gates: Mapping[str, ProviderGate]
    provider_refusals: ProviderRefusalPolicy
    usage: UsageLedger
    backfill: ProfileBackfill
    batches: BatchBackfill | None
    keyword_batches: KeywordBatches | None = None


@dataclass(frozen=True, slots=True)
class _Databases:
    stage_pool: StagePool
    engine: AsyncEngine
    probe_engine: AsyncEngine
    search_engine: AsyncEngine


@asynccontextmanager
async def build_worker(settings: Settings, metrics: WorkerMetrics) -> AsyncIterator[Worker]:
    """The running worker, its parts counting in ``metrics``; on exit the worker pool stops
    (running work gets ``SHUTDOWN_GRACE_SECONDS``), then providers, engines and pools close.

    Raises ``ConfigurationError`` when no usable presets exist for the profile (§4) or the
    ai.* vector columns are not of ``Settings.vector_dimension`` (§5).
    """
    async with AsyncExitStack() as stack:
        _warn_about_a_small_pool(settings)
        databases = await _open_databases(stack, settings)
        # Closed after the worker pool (later callbacks run first): the stages' last calls are
        # written on shutdown, on the support engine (never a stage's transaction).
        ledger = UsageLedger(
            databases.engine,
            metrics,
            settings.prices,
            flush_seconds=settings.usage_flush_seconds,
            # Today's totals are read after each write (every flush interval) even without a
            # cap: pinlog_provider_tokens_today shows them (docs/operations.md).
            watch_totals=True,
            batch_discount=settings.provider_batch_discount,
        )
        await ledger.read_totals()  # a cap reached before this start holds at once
        ledger.start()
        stack.push_async_callback(ledger.aclose)
        providers = open_providers(stack, settings, metrics, ledger)
        gates = providers.gates
        # A column of another width would fail every save; refuse before serving (§5).
        await check_vector_columns(databases.engine, settings.vector_dimension)
        presets = PresetCache(
            databases.engine,
            settings.embedding_profile,
            refresh_seconds=settings.presets_refresh_seconds,
        )
        await presets.reload()
        # A new list is picked up in the background, never on a request (§4 Deviation).
        presets.start_refreshing()
        stack.push_async_callback(presets.aclose)
        limits = StageLimits(
            expiry_seconds=settings.processing_expiry_seconds,
            max_input_chars=settings.embedding_max_input_chars,
        )
        processor = _processor(
            settings,
            metrics,
            limits,
            databases.stage_pool,
            embedder=providers.stage_embedder,
            gates=gates,
            judge=providers.judge,
            presets=presets,
        )
        pool = WorkerPool(
            processor.process,
            concurrency=settings.worker_concurrency,
            capacity=settings.queue_capacity,
            metrics=metrics,
        )
        pool.start()
        stack.push_async_callback(pool.stop, settings.shutdown_grace_seconds)
        readiness = Readiness(
            databases.probe_engine,
            presets,
            gates,
            profile=settings.embedding_profile,
            offline=settings.offline,
            max_request_bytes=settings.max_request_bytes,
            batch=settings.batch_api,
            keyword_batch=settings.keyword_batch_api,
        )
        stack.push_async_callback(readiness.aclose)
        batches = _batches(settings, metrics, databases.stage_pool, gates, ledger)
        if batches is not None:
            # Batches submitted before a restart are polled and settled by this process too.
            batches.start()
            stack.push_async_callback(batches.aclose)
        keyword_batches = _keyword_batches(
            settings, metrics, databases.stage_pool, gates, ledger, presets
        )
        if keyword_batches is not None:
            keyword_batches.start()
            stack.push_async_callback(keyword_batches.aclose)
        search = SearchService(
            databases.search_engine,
            StageTagged(providers.embedder, "search"),
            gates["embedding"],
            metrics=metrics,
            profile=settings.embedding_profile,
            max_input_chars=limits.max_input_chars,
            cuts=SearchCuts(
                floor=settings.search_similarity_floor,
                floor_word=settings.search_similarity_floor_word,
                top_ratio=settings.search_top_ratio,
            ),
            keyword_match_threshold=settings.search_keyword_match_threshold,
            keyword_match_top=settings.search_keyword_match_top,
        )
        logger.info(
            "worker ready: mode=%s profile=%s judge=%s concurrency=%d",
            "offline" if settings.offline else "online",
            settings.embedding_profile,
            settings.judge_profile,
            settings.worker_concurrency,
        )
        yield Worker(
            stage_pool=databases.stage_pool,
            engine=databases.engine,
            pool=pool,
            processor=processor,
            presets=presets,
            readiness=readiness,
            search=search,
            gates=gates,
            provider_refusals=ProviderRefusalPolicy(
                settings.refuse_while_provider_unavailable,
                metrics.rejected["provider_unavailable"],
                gates,
            ),
            usage=ledger,
            backfill=ProfileBackfill(
                databases.stage_pool,
                StageTagged(providers.embedder, "backfill"),
                gates["embedding"],
                metrics=metrics,
                profile=settings.embedding_profile,
                dimension=settings.vector_dimension,  # stored, zero-padded (§5)
                max_input_chars=limits.max_input_chars,
                expiry_seconds=settings.processing_expiry_seconds,
                batch_tokens=providers.embedding_batch_tokens,
                request_deadline_seconds=settings.request_timeout_seconds,
            ),
            batches=batches,
            keyword_batches=keyword_batches,
        )


def _batches(
    settings: Settings,
    metrics: WorkerMetrics,
    stage_pool: StagePool,
    gates: Mapping[str, ProviderGate],
    ledger: UsageLedger,
) -> BatchBackfill | None:
    """The Batch API backfill of this profile, when its provider has one (``batch_api``)."""
    if not settings.batch_api or settings.embedding_api_key is None:
        return None
    return BatchBackfill(
        stage_pool,
        BatchClient(
            settings.embedding_base_url,
            settings.embedding_api_key.get_secret_value(),
            settings.provider_timeout_seconds,
            "embedding",
        ),
        gates["embedding"],
        usage=ledger,
        metrics=metrics,
        profile=settings.embedding_profile,
        model=settings.embedding_model,
        model_dimension=settings.embedding_dimension,
        dimension=settings.vector_dimension,
        max_input_chars=settings.embedding_max_input_chars,
        expiry_seconds=settings.processing_expiry_seconds,
        poll_seconds=settings.batch_poll_seconds,
    )


def _keyword_batches(
    settings: Settings,
    metrics: WorkerMetrics,
    stage_pool: StagePool,
    gates: Mapping[str, ProviderGate],
    ledger: UsageLedger,
    presets: PresetCache,
) -> KeywordBatches | None:
    """A keyword reprocess by the judge's Batch API, when it has one (``keyword_batch_api``)."""
    if not settings.keyword_batch_api or settings.judge_api_key is None:
        return None
    return KeywordBatches(
        stage_pool,
        BatchClient(
            settings.judge_base_url,
            settings.judge_api_key.get_secret_value(),
            settings.provider_timeout_seconds,
            "judge",
        ),
        gates["judge"],
        presets,
        usage=ledger,
        metrics=metrics,
        profile=settings.embedding_profile,
        model=settings.judge_model,
        model_profile=settings.judge_profile,
        top_k=settings.keyword_top_k,
        similarity_floor=settings.keyword_similarity_floor,
        max_input_chars=settings.embedding_max_input_chars,
        expiry_seconds=settings.processing_expiry_seconds,
        poll_seconds=settings.batch_poll_seconds,
    )


async def _open_databases(stack: AsyncExitStack, settings: Settings) -> _Databases:
    """The stage pool and three engines, each closed by ``stack``."""
    # The stage statements (§3) run on a plain asyncpg pool; this engine serves the preset
    # cache and startup checks.
    command_timeout = command_timeout_for(
        failure_policy.stage_deadline_seconds(settings.processing_expiry_seconds)
    )
    stage_pool = await StagePool.open(
        settings.database_url,
        size=settings.pool_size,
        transaction_pooling=settings.database_transaction_pooling,
        command_timeout_seconds=command_timeout,
    )
    stack.push_async_callback(stage_pool.close)

    def open_engine(
        pool_size: int, database_url: str | None = None, **options: bool
    ) -> AsyncEngine:
        engine = create_engine(
            database_url or settings.database_url,
            pool_size=pool_size,
            transaction_pooling=settings.database_transaction_pooling,
            command_timeout_seconds=command_timeout,
            **options,
        )
        stack.push_async_callback(engine.dispose)
        return engine

    engine = open_engine(SUPPORT_CONNECTIONS)
    # Readiness has its own connection: a busy or exhausted worker pool must not make /readyz
    # wait.
    probe_engine = open_engine(1, with_vector_codec=False, pre_ping=True)
    # Search has its own small pool, so a burst of stage work never queues it (§7); it may
    # read a replica (PINLOG_SEARCH_DATABASE_URL): it only reads, and a note the replica has
    # not replayed yet is simply not found yet.
    search_engine = open_engine(SEARCH_CONNECTIONS, settings.search_database_url)
    return _Databases(stage_pool, engine, probe_engine, search_engine)


def _processor(
    settings: Settings,
    metrics: WorkerMetrics,
    limits: StageLimits,
    stage_pool: StagePool,
    *,
    embedder: EmbeddingProvider,
    gates: Mapping[str, ProviderGate],
    judge: KeywordJudge,
    presets: PresetCache,
) -> ContextProcessor:
    """§3 for one request: the start, then the embedding and keyword stages."""
    embedding_stage = EmbeddingStage(
        stage_pool,
        embedder,
        gates["embedding"],
        metrics=metrics,
        limits=limits,
        profile=settings.embedding_profile,
        dimension=settings.vector_dimension,  # stored, zero-padded (§5)
    )
    return ContextProcessor(
        stage_pool,
        embedding_stage,
        KeywordStage(
            stage_pool,
            judge,
            gates["judge"],
            presets,
            metrics=metrics,
            limits=limits,
            top_k=settings.keyword_top_k,
            similarity_floor=settings.keyword_similarity_floor,
        ),
        limits=limits,
        metrics=metrics,
    )


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
