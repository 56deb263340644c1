"""Session-wide database for the suite: ``PINLOG_TEST_DATABASE_URL`` or an embedded server;
under ``pytest -n N`` (``make test``) one cluster with a database per worker
(``tests/parallel_databases.py``).

The schema is applied once from ``pinlog_platform.contract.schema`` (every file, as ``pinlog-core db
upgrade``); every test starts from empty ai and core tables (TRUNCATE), so no test depends on
another's order.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from app.repository import keyword_preset
from app.repository.db import create_engine
from app.repository.stage_pool import StagePool
from pinlog_platform.contract import schema as migrations
from tests import parallel_schedule
from tests.fake_openai import FakeOpenAI, Scripted
from tests.parallel_databases import (
    DATABASE_DDL_TIMEOUT_SECONDS,
    WORKER_DATABASE_URL,
    WorkerDatabases,
    start_embedded_cluster,
)
from tests.worker.harness import embed_bundled_presets, running_worker, worker_settings

# Modules that start the services or other programs as subprocesses, besides every e2e test:
# marked ``processes`` so that ``make test-fast`` can leave them out.
PROCESS_MODULES = frozenset(
    {
        "tests/core/cli/test_cli.py",
        "tests/core/cli/test_retry_failed.py",
        "tests/core/cli/test_reprocess_keywords.py",
        "tests/ops/test_doctor.py",
        "tests/ops/test_embedded_postgres_unclean_exit.py",
        "tests/ops/test_pgbouncer.py",
        "tests/ops/test_prometheus_rules.py",
        "tests/ops/test_serve_options.py",
        "tests/worker/providers/test_analyser_loading.py",
    }
)
TESTS_ROOT = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before xdist reads the lanes (``xdist_group``)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = item.path.resolve().relative_to(TESTS_ROOT.parent).as_posix()
        if module.startswith("tests/e2e/") or module in PROCESS_MODULES:
            item.add_marker(pytest.mark.processes)
        if item.get_closest_marker("serial") is not None:
            item.add_marker(pytest.mark.xdist_group(parallel_schedule.serial_lane(module)))
    if hasattr(config, "workerinput"):
        parallel_schedule.processes_first(items)


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """xdist controller: with the default ``--dist load``, ``tests/parallel_schedule.py``."""
    if config.getvalue("dist") != "load":
        return None
    return parallel_schedule.make_scheduler(config, log)


# The xdist controller's databases for its workers, made when the first worker is configured.
_worker_databases: list[WorkerDatabases] = []


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist controller: before worker ``node`` starts, give it a migrated database of its own
    in the run's one cluster (``tests/parallel_databases.py``)."""
    if not _worker_databases:
        cluster = os.environ.get("PINLOG_TEST_DATABASE_URL") or start_embedded_cluster()
        _worker_databases.append(WorkerDatabases(cluster))
    node.workerinput[WORKER_DATABASE_URL] = _worker_databases[0].for_worker(node.gateway.id)


def pytest_unconfigure(config: pytest.Config) -> None:
    while _worker_databases:
        _worker_databases.pop().drop()


# Each table before the tables it references (the order _clean_tables deletes in).
CLEANED_TABLES = (
    "ai.context_keyword",
    "ai.context_keyword_analysis",
    "ai.context_embedding",
    "ai.context_ai_state",
    "ai.context_text_fingerprint",
    "ai.keyword_preset_embedding",
    "ai.keyword_preset",
    "ai.provider_usage_daily",
    "ai.context_embedding_backfill",
    "ai.provider_batch",
    "core.embedding_switch",
    "core.context",
    "core.dispatch_control",
    "core.record",
    "core.place",
    "core.member_daily_notes",
    "core.member",
    # the members' quota buckets: a test that empties member 1's must not limit the next one
    "core.rate_bucket",
)


@pytest.fixture(scope="session")
def database_url(request: pytest.FixtureRequest) -> str:
    """This session's database: under xdist the worker's own (``tests/parallel_databases.py``),
    else ``PINLOG_TEST_DATABASE_URL`` or a fresh embedded server's."""
    workerinput = getattr(request.config, "workerinput", None)
    if workerinput is not None and WORKER_DATABASE_URL in workerinput:
        return workerinput[WORKER_DATABASE_URL]
    url = os.environ.get("PINLOG_TEST_DATABASE_URL")
    if url:
        return url
    return start_embedded_cluster()


@pytest.fixture(scope="session")
async def migrated_database(database_url: str) -> str:
    engine = create_engine(database_url, with_vector_codec=False)
    try:
        await migrations.upgrade(engine)
    finally:
        await engine.dispose()
    return database_url


@pytest.fixture(scope="session")
async def engine(migrated_database: str) -> AsyncIterator[AsyncEngine]:
    # The tests' own engine pings: some tests terminate every other session on purpose.
    engine = create_engine(migrated_database, pool_size=30, pre_ping=True)
    yield engine
    await engine.dispose()


# DELETE, not TRUNCATE: the tables hold a few rows between tests, and a TRUNCATE of them all
# (new files for every table and index) cost 45 ms per test against 6 ms (measured on the
# embedded cluster). CLEANED_TABLES lists every table before those it references; the search
# terms go with their contexts (ON DELETE CASCADE). One round trip (the simple query protocol).
_CLEAN = "; ".join(f"DELETE FROM {table}" for table in CLEANED_TABLES)


@pytest.fixture(autouse=True)
async def _clean_tables(request: pytest.FixtureRequest) -> None:
    if "engine" not in request.fixturenames:
        return
    engine: AsyncEngine = request.getfixturevalue("engine")
    async with engine.begin() as conn:
        raw = await conn.get_raw_connection()
        await raw.driver_connection.execute(_CLEAN)


@pytest.fixture
async def make_empty_database(migrated_database: str):
    """``await make_empty_database()``: a brand-new database URL on the test server; every
    database made is dropped afterwards."""
    admin = create_engine(
        migrated_database,
        with_vector_codec=False,
        command_timeout_seconds=DATABASE_DDL_TIMEOUT_SECONDS,
    )
    made: list[str] = []

    async def factory() -> str:
        name = f"migration_{uuid.uuid4().hex[:12]}"
        async with admin.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(text(f'CREATE DATABASE "{name}"'))
        made.append(name)
        return make_url(migrated_database).set(database=name).render_as_string(hide_password=False)

    yield factory
    async with admin.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        for name in made:
            await conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    await admin.dispose()


@pytest.fixture
async def empty_database(make_empty_database) -> str:
    """A brand-new database on the test server, dropped afterwards."""
    return await make_empty_database()


@pytest.fixture
def migrations_dir() -> Path:
    return migrations.runner.bundled_directory()


@pytest.fixture(scope="session")
def fake_openai_server():
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def fake_openai(fake_openai_server):
    """The fake OpenAI server with calls, requests and scripts forgotten."""
    fake_openai_server.reset()
    return fake_openai_server


@pytest.fixture(scope="session")
async def bundled_preset_rows(engine, migrated_database, fake_openai_server):
    """The bundled presets as embedded once per session by the real loader (fake server).

    Session-scoped, so it can be set up before the per-test TRUNCATE: start from empty tables
    and a fake server without scripts itself, whatever the test before left (under xdist the
    first test to need it can come after any other)."""
    fake_openai_server.reset()
    async with engine.begin() as conn:
        await conn.execute(text(f"TRUNCATE {', '.join(CLEANED_TABLES)} CASCADE"))
    settings = worker_settings(migrated_database, fake_openai_server)
    return await embed_bundled_presets(engine, settings, fake_openai_server)


@pytest.fixture
async def presets(engine, bundled_preset_rows, fake_openai):
    """The bundled presets stored under the worker's profile; no embedding call is counted."""
    async with engine.begin() as conn:
        await keyword_preset.upsert_all(conn, bundled_preset_rows)


@pytest.fixture
async def worker(engine, migrated_database, fake_openai, presets):
    """A running worker (real app, real uvicorn) wired to the fake OpenAI server."""
    async with running_worker(worker_settings(migrated_database, fake_openai)) as running:
        yield running


@pytest.fixture
def make_worker(migrated_database: str, fake_openai, presets):
    """``async with make_worker(**overrides) as w``: a worker with overridden settings."""

    def factory(**overrides: Any):
        return running_worker(worker_settings(migrated_database, fake_openai, **overrides))

    return factory


@pytest.fixture
def hold():
    """``hold()`` makes a ``Scripted`` answer that waits until ``.block.set()``.

    Every hold is released at teardown, so a failing test never leaves a call hanging.
    """
    made: list[Scripted] = []

    def factory() -> Scripted:
        scripted = Scripted(block=threading.Event())
        made.append(scripted)
        return scripted

    yield factory
    for scripted in made:
        assert scripted.block is not None
        scripted.block.set()


@pytest.fixture
async def stage_pool(migrated_database: str) -> AsyncIterator[StagePool]:
    """The worker's stage statements' pool (``app.repository.stage_pool``) on the test database."""
    pool = await StagePool.open(migrated_database, size=10)
    yield pool
    await pool.close()
