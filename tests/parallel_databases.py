"""One PostgreSQL cluster for a parallel run (``pytest -n N``), one database per xdist worker.

The xdist controller starts the cluster (the embedded one, or the server of
``PINLOG_TEST_DATABASE_URL``), migrates a template database once, and clones it for each worker
(``CREATE DATABASE ... TEMPLATE``) before that worker starts; the worker finds its database's
URL in ``workerinput``. Every database-scoped thing a test does (tables, ``ALTER DATABASE``,
advisory locks, sessions filtered by ``datname = current_database()``) is then private to its
worker. Cluster-wide things are not: roles (create them with ``ensure_login_role``) and sessions
not filtered by database.
"""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection

from app import embedded_postgres
from app.repository.db import create_engine
from pinlog_platform.contract import schema as migrations

# The key of a worker's database URL in xdist's ``workerinput``.
WORKER_DATABASE_URL = "pinlog_database_url"
# CREATE and DROP DATABASE wait for a checkpoint, which takes long while other workers write.
DATABASE_DDL_TIMEOUT_SECONDS = 120


def start_embedded_cluster() -> str:
    """Start an embedded server for this run; return the URL of its ``postgres`` database.

    Not under pytest's numbered temp directories: a concurrent pytest session on the same
    machine prunes old ones and could delete a running server's data directory."""
    data_dir = Path(tempfile.mkdtemp(prefix="pinlog-test-pg-")) / "data"
    url = embedded_postgres.start(data_dir, delete_on_exit=True)
    asyncio.run(_without_durability(url))
    return url


# A throwaway cluster needs no durability against an operating-system crash: without the
# flush to disk at every commit and full-page images after checkpoints, the per-test TRUNCATE
# and the tests' many small transactions cost a fraction (each is a reload-time setting). A
# crash of PostgreSQL itself, which some tests cause, loses nothing with these off. Commits stay
# synchronous (written, not flushed): with asynchronous commit a VACUUM right after an insert
# cannot mark its pages all-visible, and plan tests expect index-only scans.
_NO_DURABILITY = (
    "ALTER SYSTEM SET fsync = off",
    "ALTER SYSTEM SET full_page_writes = off",
    "SELECT pg_reload_conf()",
)


async def _without_durability(url: str) -> None:
    engine = create_engine(url, with_vector_codec=False)
    try:
        async with engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            for statement in _NO_DURABILITY:
                await conn.execute(text(statement))
    finally:
        await engine.dispose()


def _url_of(cluster_url: str, database: str) -> str:
    return make_url(cluster_url).set(database=database).render_as_string(hide_password=False)


class WorkerDatabases:
    """The controller's side: a migrated template, cloned once per xdist worker.

    Names carry a random run id, so two runs on one external server do not collide; ``drop``
    removes them (the embedded cluster is deleted with its data directory anyway)."""

    def __init__(self, cluster_url: str) -> None:
        self._cluster_url = cluster_url
        run = uuid.uuid4().hex[:8]
        self._prefix = f"pinlog_test_{run}"
        self._template = f"{self._prefix}_template"
        self._made: list[str] = []
        asyncio.run(self._make_template())

    async def _admin(self, statement: str) -> None:
        admin = create_engine(
            self._cluster_url,
            with_vector_codec=False,
            command_timeout_seconds=DATABASE_DDL_TIMEOUT_SECONDS,
        )
        try:
            async with admin.connect() as conn:
                conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
                await conn.execute(text(statement))
        finally:
            await admin.dispose()

    async def _make_template(self) -> None:
        await self._admin(f'CREATE DATABASE "{self._template}"')
        self._made.append(self._template)
        engine = create_engine(_url_of(self._cluster_url, self._template), with_vector_codec=False)
        try:
            await migrations.upgrade(engine)
        finally:
            # CREATE DATABASE ... TEMPLATE refuses while anyone is connected to the template.
            await engine.dispose()

    def for_worker(self, worker_id: str) -> str:
        """The URL of a fresh migrated database for ``worker_id`` (``gw0``, ``gw1``...)."""
        name = f"{self._prefix}_{worker_id}"
        asyncio.run(self._admin(f'CREATE DATABASE "{name}" TEMPLATE "{self._template}"'))
        self._made.append(name)
        return _url_of(self._cluster_url, name)

    def drop(self) -> None:
        async def drop_all() -> None:
            for name in reversed(self._made):
                await self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

        asyncio.run(drop_all())


ENSURE_LOGIN_ROLE = (
    # Roles are cluster-wide: parallel workers may create the same one at once. The loser of
    # that race waits on the catalog's unique index, then gets unique_violation.
    "DO $$ BEGIN "
    "IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '{login}') THEN "
    "CREATE ROLE {login} LOGIN IN ROLE {member_of}; END IF; "
    "EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL; "
    "END $$"
)


async def ensure_login_role(conn: AsyncConnection, login: str, member_of: str) -> None:
    """Create the login role ``login``, a member of ``member_of``, unless it exists; safe when
    parallel workers race for it. Both names are the tests' own constants."""
    await conn.execute(text(ENSURE_LOGIN_ROLE.format(login=login, member_of=member_of)))
