"""pgvector installed in a schema other than ``public`` (common on managed PostgreSQL).

The worker finds the ``vector`` type through the search path, as the SQL does; when no
``vector`` type is visible, connecting fails with one line naming the fix.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from app.cli import app as ai_cli
from app.errors import ConfigurationError
from app.repository.db import VECTOR_TYPE_MISSING, create_engine
from pinlog_platform.contract import schema as migrations

ROUND_TRIP = text("SELECT CAST(:v AS vector) AS v")


async def _admin(url: str, *statements: str) -> None:
    engine = create_engine(url, with_vector_codec=False)
    try:
        async with engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            for statement in statements:
                await conn.execute(text(statement))
    finally:
        await engine.dispose()


async def _migrated_with_vector_in_extensions(url: str) -> str:
    """Install pgvector in schema ``extensions`` (on the search path) and migrate; the
    database's name."""
    database = url.rsplit("/", 1)[1].split("?")[0]
    await _admin(
        url,
        "CREATE SCHEMA extensions",
        "CREATE EXTENSION vector SCHEMA extensions",
        f'ALTER DATABASE "{database}" SET search_path = "$user", public, extensions',
    )
    migration_engine = create_engine(url, with_vector_codec=False)
    try:
        await migrations.upgrade(migration_engine)
    finally:
        await migration_engine.dispose()
    return database


async def test_vector_in_another_schema_on_the_search_path(empty_database: str) -> None:
    await _migrated_with_vector_in_extensions(empty_database)
    engine = create_engine(empty_database)
    try:
        async with engine.connect() as conn:
            value = (await conn.execute(ROUND_TRIP, {"v": np.ones(3)})).scalar_one()
            schema = await conn.execute(
                text("SELECT typnamespace::regnamespace::text FROM pg_type WHERE typname='vector'")
            )
    finally:
        await engine.dispose()
    assert value.to_numpy().tolist() == [1.0, 1.0, 1.0]  # decoded by the registered codec
    assert schema.scalar_one() == "extensions"


async def test_no_visible_vector_type_fails_with_one_line(empty_database: str) -> None:
    engine = create_engine(empty_database)
    try:
        with pytest.raises(ConfigurationError, match="not on the database search path"):
            async with engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
    finally:
        await engine.dispose()


async def test_presets_load_refuses_with_one_line(empty_database: str, monkeypatch) -> None:
    """Migrated with the extension in ``extensions``, then the search path loses it."""
    database = await _migrated_with_vector_in_extensions(empty_database)
    await _admin(empty_database, f'ALTER DATABASE "{database}" SET search_path = "$user", public')
    for name, value in {
        "PINLOG_DATABASE_URL": empty_database,
        "PINLOG_INTERNAL_SECRET": "vector-schema-test-secret-0123456789",
        "PINLOG_EMBEDDING_PROVIDER": "hashing",
        "PINLOG_EMBEDDING_MODEL": "hashing-char-ngram",
        "PINLOG_EMBEDDING_PROFILE": "local-hashing-char-ngram-1536-cosine-v1",
        "PINLOG_JUDGE_PROVIDER": "similarity",
    }.items():
        monkeypatch.setenv(name, value)
    result = await asyncio.to_thread(CliRunner().invoke, ai_cli, ["presets", "load"])
    assert result.exit_code == 4  # reachable, but not ready (app/exit_codes.py)
    assert result.output.strip().splitlines() == [f"pinlog-ai: {VECTOR_TYPE_MISSING}"]
