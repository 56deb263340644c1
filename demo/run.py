"""``pinlog-ai demo`` (the README's ``make run``): both services, offline, on real parts.

Embedded PostgreSQL (unless ``PINLOG_DATABASE_URL`` is set) -> every migration (core and ai,
as ``pinlog-core db upgrade``) -> presets embedded with the offline encoder
(``PINLOG_OFFLINE``) -> the AI worker and the core service served over HTTP in this process
-> the bundled sample notes sent to the core's client API with member tokens: creates, then
edits (one whitespace-only, a no-op) and deletes (§9) -> wait for the worker -> a table of
every context, replaced and deleted ones included, and the keywords a record shows to its
owner and to another member -> keep serving until interrupted.

The parts of the run; ``demo.cli`` runs them in order (and, with ``--operations``,
``demo.operations`` after the table).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass

import httpx
import uvicorn
from fastapi import FastAPI

from app.main import create_app
from app.providers.factory import build_embedding_provider
from app.repository.db import create_engine
from app.service.preset_loader import LoadReport, PresetFile, load_presets, read_preset_file
from app.settings import Settings
from core_service.main import create_app as create_core_app
from core_service.settings import CoreSettings
from demo.feed import DemoClient, FeedOutcome, load_changes, load_samples, member_tokens
from demo.report import ContextResult, load_results, wait_until_finished
from pinlog_platform.contract import schema as migrations

WAIT_SECONDS = 300.0
Say = Callable[[str], None]


def say_now(line: str) -> None:
    """One progress line, shown at once."""
    print(line, flush=True)


def offline_settings(
    database_url: str, internal_secret: str | None = None, **overrides: object
) -> Settings:
    """Development settings: the ``PINLOG_OFFLINE`` switch (local encoder and learned judge,
    no network, no keys; ``app.settings.OFFLINE_DEFAULTS``); explicit settings still win."""
    values: dict[str, object] = {
        "database_url": database_url,
        "internal_secret": internal_secret or secrets.token_urlsafe(24),
        "offline": True,
    }
    values.update(overrides)
    return Settings(**values)


def core_settings_for(settings: Settings, worker_base_url: str, jwt_secret: str) -> CoreSettings:
    """The core service's settings matching the worker's: same database, secret, profile."""
    return CoreSettings(
        database_url=settings.database_url,
        worker_base_url=worker_base_url,
        internal_secret=settings.internal_secret,
        jwt_secret=jwt_secret,
        embedding_profile=settings.embedding_profile,
    )


def free_port(preferred: int) -> int:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", preferred))
        except OSError:
            probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def prepare_database(settings: Settings, *, say: Say = print) -> None:
    """Apply every migration (core and ai) and load presets with the settings' profile,
    saying one line for each step."""
    engine = create_engine(settings.database_url, with_vector_codec=False)
    try:
        applied = await migrations.upgrade(engine, scope=migrations.Scope.ALL)
    finally:
        await engine.dispose()
    say(f"migrations: {len(applied)} applied" + ("" if applied else " (already up to date)"))
    say("presets: loading the offline encoder and embedding the preset list ...")
    report = await embed_presets(settings, read_preset_file())
    state = "embedded and stored" if report.changed else "already stored"
    say(f"presets: {report.presets} {state} (list version {report.version})")


async def embed_presets(settings: Settings, preset_file: PresetFile) -> LoadReport:
    """``pinlog-ai presets load`` with ``settings`` (their embedder and profile)."""
    engine = create_engine(settings.database_url)
    embedder = build_embedding_provider(settings)
    try:
        return await load_presets(engine, embedder, preset_file, settings.embedding_profile)
    finally:
        await embedder.aclose()
        await engine.dispose()


@dataclass
class ServedApp:
    """One app served by uvicorn in this process, at ``url``."""

    url: str
    app: FastAPI
    server: uvicorn.Server
    task: asyncio.Task

    @property
    def stopped(self) -> bool:
        return self.server.should_exit or self.task.done()

    async def stop(self) -> None:
        """Stop serving (idempotent), as SIGTERM would."""
        self.server.should_exit = True
        await self.task


@dataclass
class RunningServices:
    """Both services served in this process, and with ``--operations`` a worker of a second
    profile; ``closed`` finishes when one of them stops unless it was stopped on purpose."""

    worker: ServedApp
    core: ServedApp
    core_settings: CoreSettings
    second_worker: ServedApp | None = None

    @property
    def worker_url(self) -> str:
        return self.worker.url

    @property
    def core_url(self) -> str:
        return self.core.url

    async def closed(self) -> None:
        served = (self.worker, self.core, self.second_worker)
        running = [s.task for s in served if s is not None and not s.stopped]
        if running:
            await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)


@asynccontextmanager
async def both_services(
    settings: Settings,
    *,
    worker_port: int = 0,
    core_port: int = 0,
    jwt_secret: str,
    second_worker: Settings | None = None,
    second_worker_port: int = 0,
) -> AsyncIterator[RunningServices]:
    """Serve the worker and the core service on loopback (``0``: any free port); with
    ``second_worker``, a worker of those settings too, listed in the core's
    ``PINLOG_CORE_WORKER_BASE_URL`` after the first from the start."""
    worker_port, core_port = free_port(worker_port), free_port(core_port)
    ports = [worker_port]
    if second_worker is not None:
        ports.append(free_port(second_worker_port))
    worker_urls = [f"http://127.0.0.1:{port}" for port in ports]
    core_settings = core_settings_for(settings, ",".join(worker_urls), jwt_secret)
    async with AsyncExitStack() as stack:
        # The workers first: the core dispatches as soon as a note is saved, and reads each
        # worker's profile when it starts.
        worker = await stack.enter_async_context(_serving(create_app(settings), ports[0]))
        second = None
        if second_worker is not None:
            second = await stack.enter_async_context(_serving(create_app(second_worker), ports[1]))
        core = await stack.enter_async_context(_serving(create_core_app(core_settings), core_port))
        yield RunningServices(worker, core, core_settings, second)


class _DemoServer(uvicorn.Server):
    """A uvicorn server that leaves signals alone: the demo serves several in one process and
    handles Ctrl-C once for all of them (``demo.cli``); each server capturing SIGINT and
    raising it again on its way out would pass one Ctrl-C along a chain of handlers and turn
    a second one into a traceback."""

    def capture_signals(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


@asynccontextmanager
async def _serving(app: FastAPI, port: int) -> AsyncIterator[ServedApp]:
    server = _DemoServer(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", log_config=None)
    )
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                await task
                raise RuntimeError("a demo server did not start")
            await asyncio.sleep(0.05)
        yield ServedApp(f"http://127.0.0.1:{port}", app, server, task)
    finally:
        server.should_exit = True
        await task


async def feed_and_report(
    services: RunningServices, *, wait_seconds: float = WAIT_SECONDS, say: Say = print
) -> tuple[FeedOutcome, list[ContextResult], list[str]]:
    """Send the samples through the core's API, wait for the worker, read everything back.

    Returns what became of each context, their results, and lines comparing the keywords
    some records show to their owner and to another member.
    """
    samples, changes = load_samples(), load_changes()
    members = {sample.user_id for sample in samples}
    tokens = await member_tokens(
        services.core_settings.database_url,
        services.core_settings.jwt_secret.get_secret_value(),
        members,
    )
    engine = create_engine(services.core_settings.database_url, pool_size=2)
    try:
        async with httpx.AsyncClient(base_url=services.core_url, timeout=10) as http:
            client = DemoClient(http, tokens)
            outcome = await client.feed(samples, changes)
            live = [line.context_id for line in outcome.lines if line.live]
            say(
                f"notes sent: {len(samples)} created by {len(members)} members, "
                f"{len(changes.edits) + len(changes.whitespace_only_edits)} edited, "
                f"{len(changes.context_deletes) + len(changes.record_deletes)} deletions; "
                f"{len(live)} live contexts for the worker"
            )
            await wait_until_finished(engine, live, limit_seconds=wait_seconds, say=say)
            views = []
            for index in changes.views:
                owner = samples[index].user_id
                other = min(members - {owner})
                record_id = outcome.record_ids[index]
                mine, theirs = await client.keyword_views(
                    record_id, outcome.public_ids[record_id], owner, other
                )
                views.append(
                    f"record {record_id} ({samples[index].place}): owner (member {owner}) sees "
                    f"[{', '.join(mine)}]; member {other}, by its public id "
                    f"{outcome.public_ids[record_id]}, sees [{', '.join(theirs)}]"
                )
        return outcome, await load_results(engine, outcome.lines), views
    finally:
        await engine.dispose()
