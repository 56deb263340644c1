"""Applies the package's ``sql/*.sql`` files in name order and records each in one ledger.

Scopes: a file named ``NNNN_core_*.sql`` changes the ``core`` schema and belongs to the core
service; every other file changes the ``ai`` schema (or both schemas' common ground, such as
the extension) and is applied by either command. ``ai`` files never depend on ``core`` files,
so either command may run first and the ``ai`` schema ends the same.

One transaction under an advisory lock: concurrent upgrades (two services starting at once)
apply each file exactly once, and a failing file leaves nothing half-applied. A file whose
content changed after it was applied stops the upgrade: migrations only grow by new files.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

# Serialises concurrent upgrades for the length of the upgrade transaction. The key predates
# the move of the files into this package and is kept so old and new runners exclude each other.
LOCK_MIGRATIONS = text("SELECT pg_advisory_xact_lock(hashtext('pinlog-ai/migrations_stub'))")

# The ledger: one row per applied file with the SHA-256 of its content. Its name predates the
# shared package; renaming it would make every existing database re-apply everything.
CREATE_LEDGER = """
    CREATE SCHEMA IF NOT EXISTS ai;
    CREATE TABLE IF NOT EXISTS ai.stub_migration (
        filename   TEXT PRIMARY KEY,
        sha256     TEXT NOT NULL,
        applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )
"""

# What was applied before, by file name.
LOAD_APPLIED = text("SELECT filename, sha256 FROM ai.stub_migration")

# Record one applied file.
RECORD_APPLIED = text("INSERT INTO ai.stub_migration (filename, sha256) VALUES (:filename, :sha)")

_FILENAME = re.compile(r"^\d{4}_[a-z0-9_]+\.sql$")
_CORE_PREFIX = re.compile(r"^\d{4}_core_")


class MigrationError(Exception):
    """The files or the ledger are inconsistent (no files, a bad name, an edited file)."""


class MigrationPrivilegeError(Exception):
    """The role running the upgrade lacks a privilege it needs; the message names it (one
    line, no URL). A role that may only use the schema (the worker's, §8) gets this instead
    of a driver traceback when something is pending."""


# What exists, and what this role may do with the ledger: checked before any DDL, so that a
# role without CREATE runs none when nothing is pending.
LEDGER_FACTS = text(
    "SELECT to_regnamespace('ai') IS NOT NULL AS has_schema, "
    "to_regclass('ai.stub_migration') IS NOT NULL AS has_ledger, "
    "CASE WHEN to_regclass('ai.stub_migration') IS NULL THEN false "
    "ELSE has_table_privilege('ai.stub_migration', 'SELECT') END AS may_read, "
    "CASE WHEN to_regclass('ai.stub_migration') IS NULL THEN false "
    "ELSE has_table_privilege('ai.stub_migration', 'INSERT') END AS may_record, "
    "has_database_privilege(current_database(), 'CREATE') AS may_create_schema, "
    "CASE WHEN to_regnamespace('ai') IS NULL THEN false "
    "ELSE has_schema_privilege('ai', 'CREATE') END AS may_create_in_ai"
)
INSUFFICIENT_PRIVILEGE = "42501"


class Scope(StrEnum):
    """Which files a command applies: ``AI`` (the worker's) or ``ALL`` (the core service's)."""

    AI = "ai"
    ALL = "all"


@dataclass(frozen=True, slots=True)
class MigrationFile:
    """One ordered SQL file; ``is_core`` files are skipped by ``Scope.AI``."""

    filename: str
    sql: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()

    @property
    def is_core(self) -> bool:
        return _CORE_PREFIX.match(self.filename) is not None


def bundled_directory() -> Path:
    """The ``sql/`` directory shipped inside this package (package data, not a repo path)."""
    return Path(str(resources.files("pinlog_platform.contract.schema") / "sql"))


def discover(directory: Path | None = None, scope: Scope = Scope.ALL) -> list[MigrationFile]:
    """The files of ``directory`` (default: the bundled ones) in ``scope``, in name order.

    Raises ``MigrationError`` when there are none or a name is not ``NNNN_lowercase.sql``.
    """
    paths = sorted((directory or bundled_directory()).glob("*.sql"))
    if not paths:
        raise MigrationError(f"no migration files in {directory or 'the bundled package'}")
    files = []
    for path in paths:
        if not _FILENAME.match(path.name):
            raise MigrationError(f"migration file name {path.name!r} is not NNNN_name.sql")
        files.append(MigrationFile(path.name, path.read_text(encoding="utf-8")))
    if scope is Scope.AI:
        files = [file for file in files if not file.is_core]
    return files


async def _execute_script(conn: AsyncConnection, sql: str) -> None:
    # Multi-statement files need the simple query protocol, which only the raw driver offers.
    raw = await conn.get_raw_connection()
    await raw.driver_connection.execute(sql)


async def upgrade(
    engine: AsyncEngine, *, scope: Scope = Scope.ALL, directory: Path | None = None
) -> list[str]:
    """Apply the pending files of ``scope``; return the names applied (empty when current).

    Raises ``MigrationError`` for an applied file that changed; driver errors of a failing
    file propagate after the whole upgrade rolled back.
    """
    migrations = discover(directory, scope)
    async with engine.begin() as conn:
        await conn.execute(LOCK_MIGRATIONS)
        facts = (await conn.execute(LEDGER_FACTS)).one()
        if not facts.has_ledger:
            _require(
                facts.has_schema or facts.may_create_schema,
                "CREATE on the database (to create schema ai)",
            )
            _require(facts.has_schema is False or facts.may_create_in_ai, "CREATE on schema ai")
            await _execute_script(conn, CREATE_LEDGER)
        else:
            _require(facts.may_read, "SELECT on ai.stub_migration (the migrations ledger)")
        applied = {row.filename: row.sha256 for row in await conn.execute(LOAD_APPLIED)}
        newly_applied: list[str] = []
        for migration in migrations:
            recorded = applied.get(migration.filename)
            if recorded is not None:
                if recorded != migration.sha256:
                    raise MigrationError(
                        f"migration {migration.filename} changed after it was applied"
                    )
                continue
            if facts.has_ledger:
                _require(facts.may_record, "INSERT on ai.stub_migration (the migrations ledger)")
            await _apply(conn, migration)
            newly_applied.append(migration.filename)
    return newly_applied


def _require(granted: bool, privilege: str) -> None:
    if not granted:
        raise MigrationPrivilegeError(
            f"the database role lacks the privilege {privilege}: run the upgrade as the "
            "schema owner "
            "(`pinlog-core db upgrade`, docs/deployment.md)"
        )


async def _apply(conn: AsyncConnection, migration: MigrationFile) -> None:
    try:
        await _execute_script(conn, migration.sql)
    except Exception as exc:
        if str(getattr(exc, "sqlstate", "")) == INSUFFICIENT_PRIVILEGE:
            # The server's message names the privilege and the object ("permission denied
            # for schema ai"); it never quotes data.
            raise MigrationPrivilegeError(
                f"migration {migration.filename} needs a privilege the database role lacks "
                f"({exc}): run the upgrade as the schema owner (docs/deployment.md)"
            ) from None
        raise
    await conn.execute(RECORD_APPLIED, {"filename": migration.filename, "sha": migration.sha256})
