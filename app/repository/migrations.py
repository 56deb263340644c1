"""Applies ``migrations_stub/*.sql`` in file-name order and records what it applied.

Idempotent: a second run applies nothing. One transaction under an advisory lock, so two
concurrent upgrades cannot interleave and a failing file leaves nothing half-applied. An
already-applied file whose content changed stops the upgrade (``ConfigurationError``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.errors import ConfigurationError
from app.repository.db import transaction

DEFAULT_MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations_stub"

# Serialises concurrent upgrades for the length of the upgrade transaction.
LOCK_MIGRATIONS = text("SELECT pg_advisory_xact_lock(hashtext('pinlog-ai/migrations_stub'))")

# Bookkeeping table: one row per applied file with the SHA-256 of its content.
CREATE_LEDGER = text(
    """
    CREATE SCHEMA IF NOT EXISTS ai;
    CREATE TABLE IF NOT EXISTS ai.stub_migration (
        filename   TEXT PRIMARY KEY,
        sha256     TEXT NOT NULL,
        applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )
    """
)

# What was applied before, by file name.
LOAD_APPLIED = text("SELECT filename, sha256 FROM ai.stub_migration")

# Record one applied file.
RECORD_APPLIED = text("INSERT INTO ai.stub_migration (filename, sha256) VALUES (:filename, :sha)")


@dataclass(frozen=True, slots=True)
class MigrationFile:
    filename: str
    sql: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def discover(directory: Path = DEFAULT_MIGRATIONS_DIR) -> list[MigrationFile]:
    """The ``*.sql`` files of ``directory`` in name order; ``ConfigurationError`` if none."""
    files = sorted(directory.glob("*.sql"))
    if not files:
        raise ConfigurationError(f"no migration files in {directory}")
    return [MigrationFile(path.name, path.read_text(encoding="utf-8")) for path in files]


async def _execute_script(conn: AsyncConnection, sql: str) -> None:
    # Multi-statement files need the simple query protocol, which only the raw driver offers.
    raw = await conn.get_raw_connection()
    await raw.driver_connection.execute(sql)


async def upgrade(engine: AsyncEngine, directory: Path = DEFAULT_MIGRATIONS_DIR) -> list[str]:
    """Apply pending files; return the names applied (empty when up to date)."""
    migrations = discover(directory)
    async with transaction(engine) as conn:
        await conn.execute(LOCK_MIGRATIONS)
        await _execute_script(conn, str(CREATE_LEDGER.text))
        applied = {row.filename: row.sha256 for row in await conn.execute(LOAD_APPLIED)}
        newly_applied: list[str] = []
        for migration in migrations:
            recorded = applied.get(migration.filename)
            if recorded is not None:
                if recorded != migration.sha256:
                    raise ConfigurationError(
                        f"migration {migration.filename} changed after it was applied"
                    )
                continue
            await _execute_script(conn, migration.sql)
            await conn.execute(
                RECORD_APPLIED, {"filename": migration.filename, "sha": migration.sha256}
            )
            newly_applied.append(migration.filename)
    return newly_applied
