"""The core service's object graph: ``build_core`` opens the engines and the worker clients,
builds the services and runs the rescan loop, and closes everything in reverse when it exits.

``core_service/main.py`` enters it in the FastAPI lifespan; ``pinlog-core rescan --once``
builds its one pass from the same parts; every operator command (``core_service/operations/``)
runs on one ``Operations`` value that ``open_operations`` opens and closes. Nothing here knows
about HTTP routes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.metrics import CoreMetrics
from core_service.repository.context_ai_state import Expiries
from core_service.repository.db import (
    COMMAND_TIMEOUT_SECONDS,
    command_timeout_for,
    create_engine,
)
from core_service.service.dispatch import WorkerDispatcher
from core_service.service.keyword_vocabulary import KeywordVocabulary
from core_service.service.lifecycle import ContextLifecycle
from core_service.service.member_export import MemberExport
from core_service.service.member_quotas import MemberQuotas, QuotaSettings
from core_service.service.member_tokens import TokenAuthenticator
from core_service.service.pause import PauseSwitch
from core_service.service.personal_search import PersonalSearch
from core_service.service.process_requests import ProcessRequestSender
from core_service.service.profile_in_use import ProfileInUse, read_profile_in_use
from core_service.service.record_pages import RecordPages
from core_service.service.record_reads import RecordReader
from core_service.service.reembed_backfill import ReembedBackfill
from core_service.service.rescan import RescanScheduler
from core_service.service.search_terms import SearchAnalyser
from core_service.service.status import StatusGauges
from core_service.service.worker_discovery import WorkerDiscovery
from core_service.service.worker_endpoints import WorkerEndpoints
from core_service.service.worker_readiness import ReadinessReader, WorkerReadiness
from core_service.service.worker_routing import ProfileRouting
from core_service.settings import CoreDatabaseSettings, CoreSettings

logger = logging.getLogger(__name__)

# Seconds that in-flight after-commit dispatches get at shutdown; the rest are left to the rescan.
DISPATCH_DRAIN_SECONDS = 2.0
# Seconds a background loop (rescan, status gauges) gets to finish at shutdown before it is
# cancelled.
RESCAN_STOP_SECONDS = 2.0


@dataclass(frozen=True, slots=True)
class Core:
    """What one core process serves with, from startup to shutdown.

    ``engine``: the request pool; ``probe_engine``: ``/readyz``'s own connection;
    ``dispatcher``: calls to the worker (after commits, held retries); ``pause``: whether
    dispatching is paused; the rest answer the client API.
    """

    engine: AsyncEngine
    probe_engine: AsyncEngine
    dispatcher: WorkerDispatcher
    pause: PauseSwitch
    lifecycle: ContextLifecycle
    reader: RecordReader
    pages: RecordPages
    keywords: KeywordVocabulary
    exports: MemberExport
    search: PersonalSearch
    authenticator: TokenAuthenticator
    quotas: MemberQuotas


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
    engine: AsyncEngine,
    endpoints: WorkerEndpoints,
    metrics: CoreMetrics,
    pause: PauseSwitch | None = None,
    profile_in_use: ProfileInUse | None = None,
) -> WorkerDispatcher:
    """Dispatches to ``endpoints`` of the profile in use, each attempt bounded by
    ``attempt_deadline``, counting the ones a worker took against ``MAX_RETRY`` and holding
    refused ones (docs/rescan.md); its retry loop runs once ``start`` is called."""
    return WorkerDispatcher(
        ProcessRequestSender(
            endpoints,
            attempt_deadline_seconds=attempt_deadline(settings),
            profile_in_use=profile_in_use
            or ProfileInUse(engine, configured=settings.embedding_profile),
        ),
        metrics,
        engine,
        max_retry=settings.max_retry,
        pending_expiry_seconds=settings.pending_expiry_seconds,
        retry_capacity=settings.dispatch_retry_capacity,
        backoff_max_seconds=settings.dispatch_backoff_max_seconds,
        pause=pause or PauseSwitch(engine, metrics),
    )


def build_scheduler(
    settings: CoreSettings,
    engine: AsyncEngine,
    dispatcher: WorkerDispatcher,
    metrics: CoreMetrics,
) -> RescanScheduler:
    """The finalize + rescan pass (§2) with the settings' expiries, budget and period."""
    return RescanScheduler(
        engine,
        dispatcher,
        metrics,
        expiries=Expiries(settings.pending_expiry_seconds, settings.processing_expiry_seconds),
        max_retry=settings.max_retry,
        batch_size=settings.batch_size,
        period_seconds=settings.rescan_period_seconds,
    )


def build_backfill(
    settings: CoreSettings,
    engine: AsyncEngine,
    endpoints: WorkerEndpoints,
    pause: PauseSwitch,
    metrics: CoreMetrics,
) -> ReembedBackfill:
    """The re-embedding backfill of one core process (its resend delay the pending expiry,
    its reclaim the processing expiry)."""
    return ReembedBackfill(
        engine,
        endpoints,
        pause,
        metrics,
        configured_profile=settings.embedding_profile,
        resend_seconds=settings.pending_expiry_seconds,
        expiry_seconds=settings.processing_expiry_seconds,
    )


@asynccontextmanager
async def build_core(
    settings: CoreSettings,
    metrics: CoreMetrics,
    *,
    run_rescan_loop: bool = True,
    run_backfill_loop: bool = True,
) -> AsyncIterator[Core]:
    """The running core, its parts counting in ``metrics``. ``run_rescan_loop=False`` leaves
    rescans to the caller (a scheduler running ``rescan --once``); the re-embedding backfill
    loop is apart from it (``run_backfill_loop``; a deployment without the rescan loop still
    needs the backfill of a switch: docs/operations.md "Loops by mode"). On exit the loops
    stop, in-flight
    dispatches get ``DISPATCH_DRAIN_SECONDS``, then clients and engines close."""
    async with AsyncExitStack() as stack:
        command_timeout = command_timeout_for(settings.request_timeout_seconds)
        engine = create_engine(
            settings.database_url,
            pool_size=settings.database_pool_size,
            transaction_pooling=settings.database_transaction_pooling,
            command_timeout_seconds=command_timeout,
        )
        stack.push_async_callback(engine.dispose)
        endpoints = build_worker_endpoints(settings)
        stack.push_async_callback(endpoints.aclose)
        discovery = WorkerDiscovery(
            endpoints,
            dns_servers=settings.worker_dns_server_addresses,
            refresh_seconds=settings.worker_dns_refresh_seconds,
        )
        if discovery.has_names:
            stack.push_async_callback(discovery.aclose)  # run_forever closes it too
            await discovery.refresh_once()  # every address known (and read) before work
            _run_until_exit(stack, discovery.run_forever)
        pause = PauseSwitch(engine, metrics)
        profile_in_use = ProfileInUse(engine, configured=settings.embedding_profile)
        routing = ProfileRouting(endpoints, metrics=metrics, profile_in_use=profile_in_use)
        stack.push_async_callback(routing.aclose)  # run_forever closes it too; twice is fine
        await routing.refresh_once()  # route the first requests by profile already
        dispatcher = build_dispatcher(
            settings, engine, endpoints, metrics, pause, profile_in_use=profile_in_use
        )
        dispatcher.start()
        stack.push_async_callback(dispatcher.close, DISPATCH_DRAIN_SECONDS)
        # Readiness on a connection of its own: a busy request pool must not fail /readyz.
        probe_engine = create_engine(
            settings.database_url,
            pool_size=1,
            transaction_pooling=settings.database_transaction_pooling,
            pre_ping=True,
            command_timeout_seconds=command_timeout,
        )
        stack.push_async_callback(probe_engine.dispose)
        lists_engine = None
        if settings.search_database_url is not None:
            # Client search's own lists on a replica; nothing else reads or writes there.
            lists_engine = create_engine(
                settings.search_database_url,
                pool_size=settings.database_pool_size,
                transaction_pooling=settings.database_transaction_pooling,
                command_timeout_seconds=command_timeout,
            )
            stack.push_async_callback(lists_engine.dispose)
        analyser = SearchAnalyser()
        await analyser.load()  # before the first note or search, off the event loop
        core = Core(
            engine=engine,
            probe_engine=probe_engine,
            dispatcher=dispatcher,
            pause=pause,
            lifecycle=ContextLifecycle(
                engine,
                dispatcher,
                metrics,
                analyser=analyser,
                daily_notes=settings.member_daily_notes,
            ),
            reader=RecordReader(engine),
            pages=RecordPages(engine),
            keywords=KeywordVocabulary(engine),
            exports=MemberExport(engine, chunk_seconds=settings.request_timeout_seconds),
            search=PersonalSearch(
                engine,
                endpoints,
                profile_in_use=profile_in_use,
                cuts=settings.search_cuts_for,
                analyser=analyser,
                lists_engine=lists_engine,
            ),
            authenticator=TokenAuthenticator(
                engine,
                secret=settings.jwt_secret.get_secret_value(),
                previous_secrets=settings.previous_jwt_secrets,
                max_lifetime_seconds=settings.token_max_lifetime_seconds,
            ),
            quotas=MemberQuotas(
                engine,
                QuotaSettings(
                    writes_per_minute=settings.member_writes_per_minute,
                    searches_per_minute=settings.member_searches_per_minute,
                    burst=settings.member_burst,
                ),
                metrics,
            ),
        )
        metrics.pending_expiry.set(settings.pending_expiry_seconds)
        gauges = StatusGauges(
            engine,
            metrics,
            processing_expiry_seconds=settings.processing_expiry_seconds,
            period_seconds=settings.status_refresh_seconds,
        )
        _run_until_exit(stack, gauges.run_forever)
        _run_until_exit(stack, routing.run_forever)
        if run_backfill_loop:
            backfill = build_backfill(settings, engine, endpoints, pause, metrics)
            _run_until_exit(stack, backfill.run_forever)
        if run_rescan_loop:
            # A pass waiting on a slow worker must not hold shutdown: its claimed rows stay
            # stale and the next pass (any replica) takes them again.
            scheduler = build_scheduler(settings, engine, dispatcher, metrics)
            _run_until_exit(stack, scheduler.run_forever)
        logger.info(
            "core service ready: worker=%s rescan every %gs",
            settings.worker_base_url,
            settings.rescan_period_seconds,
        )
        yield core


def _run_until_exit(stack: AsyncExitStack, run_forever) -> None:
    """Run ``run_forever(stop)`` as a task until ``stack`` closes; it gets
    ``RESCAN_STOP_SECONDS`` to stop, then it is cancelled."""
    stop = asyncio.Event()
    task = asyncio.create_task(run_forever(stop))

    async def stop_task() -> None:
        stop.set()
        done, _ = await asyncio.wait({task}, timeout=RESCAN_STOP_SECONDS)
        if not done:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    stack.push_async_callback(stop_task)


# Connections of a command's engine: a command runs one statement at a time, or one beside
# its dispatcher's.
COMMAND_POOL_SIZE = 2


def command_engine(
    settings: CoreDatabaseSettings,
    *,
    pool_size: int = COMMAND_POOL_SIZE,
    command_timeout_seconds: float | None = COMMAND_TIMEOUT_SECONDS,
) -> AsyncEngine:
    """The engine of one ``pinlog-core`` command run (every command opens its engine here);
    ``command_timeout_seconds=None`` for migrations."""
    return create_engine(
        settings.database_url,
        pool_size=pool_size,
        transaction_pooling=settings.database_transaction_pooling,
        command_timeout_seconds=command_timeout_seconds,
    )


class Operations:
    """What an operator command runs on (``core_service/operations/``), opened once and closed
    once by ``open_operations``: ``settings`` (the command's settings class), ``engine``,
    ``metrics``, and, opened at first use and only with settings that name the workers, the
    workers' readiness (``readings``), their clients (``endpoints``), their profiles
    (``refresh_routing``) and a started dispatcher (``dispatcher``)."""

    def __init__(self, settings, engine: AsyncEngine, stack: AsyncExitStack) -> None:
        self.settings = settings
        self.engine = engine
        self.metrics = CoreMetrics()
        self._stack = stack
        self._reader: ReadinessReader | None = None
        self._endpoints: WorkerEndpoints | None = None
        self._dispatcher: WorkerDispatcher | None = None

    async def profile_in_use(self) -> str:
        """The profile in use now (no cache): the switch row's, else the configured one."""
        return await read_profile_in_use(self.engine, configured=self.settings.embedding_profile)

    async def reader(self) -> ReadinessReader:
        """The reader of every worker instance's ``/readyz``: each listed URL, a DNS name's
        as every address it resolves to now (``WorkerDiscovery``, resolved once per
        command)."""
        if self._reader is None:
            # Clients of its own: the discovery closes the ones it drops, which the
            # command's dispatcher (``endpoints``) may still be using.
            listed = build_worker_endpoints(self.settings)
            self._stack.push_async_callback(listed.aclose)
            instances = list(listed.all)
            discovery = WorkerDiscovery(
                listed,
                dns_servers=self.settings.worker_dns_server_addresses,
                refresh_seconds=self.settings.worker_dns_refresh_seconds,
            )
            if discovery.has_names:
                self._stack.push_async_callback(discovery.aclose)
                await discovery.refresh_once()
                instances = list(discovery.instances)
            self._reader = ReadinessReader(
                [e.base_url for e in instances] or self.settings.worker_base_urls,
                host_headers=[e.host_header for e in instances] or None,
            )
            self._stack.push_async_callback(self._reader.aclose)
        return self._reader

    async def readings(self) -> list[WorkerReadiness]:
        """Every worker instance's ``/readyz`` now (``reader``)."""
        return await (await self.reader()).read_all()

    def endpoints(self) -> WorkerEndpoints:
        """One pooled client per listed worker (``build_worker_endpoints``)."""
        if self._endpoints is None:
            self._endpoints = build_worker_endpoints(self.settings)
            self._stack.push_async_callback(self._endpoints.aclose)
        return self._endpoints

    async def refresh_routing(self) -> None:
        """Read each worker's profile and body limit once (``ProfileRouting.refresh_once``)."""
        routing = ProfileRouting(self.endpoints())
        try:
            await routing.refresh_once()
        finally:
            await routing.aclose()

    def dispatcher(self) -> WorkerDispatcher:
        """A started dispatcher to the listed workers; in-flight dispatches get
        ``DISPATCH_DRAIN_SECONDS`` when the operations close."""
        if self._dispatcher is None:
            dispatcher = build_dispatcher(
                self.settings, self.engine, self.endpoints(), self.metrics
            )
            dispatcher.start()
            self._stack.push_async_callback(dispatcher.close, DISPATCH_DRAIN_SECONDS)
            self._dispatcher = dispatcher
        return self._dispatcher


@asynccontextmanager
async def open_operations(settings: CoreDatabaseSettings) -> AsyncIterator[Operations]:
    """The ``Operations`` of one command run on ``settings``; everything it opened is closed
    in reverse on exit (the dispatcher drained, the clients, then the engine)."""
    async with AsyncExitStack() as stack:
        engine = command_engine(settings)
        stack.push_async_callback(engine.dispose)
        yield Operations(settings, engine, stack)
