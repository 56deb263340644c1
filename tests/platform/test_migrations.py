"""``pinlog_platform.contract.schema``: the shared migration runner of both services (§1, §8)."""

from __future__ import annotations

import asyncio
import shutil

import pytest
from sqlalchemy import text

from app.repository.db import create_engine
from app.settings import Settings
from pinlog_platform.contract import schema as migrations
from pinlog_platform.contract.schema import MigrationError


async def test_upgrade_twice_applies_everything_then_nothing(empty_database):
    engine = create_engine(empty_database, with_vector_codec=False)
    try:
        first = await migrations.upgrade(engine)
        second = await migrations.upgrade(engine)
    finally:
        await engine.dispose()
    assert first == [m.filename for m in migrations.discover()]
    assert second == []


async def test_concurrent_upgrades_apply_each_file_once(empty_database):
    engines = [create_engine(empty_database, with_vector_codec=False) for _ in range(3)]
    try:
        applied = await asyncio.gather(*(migrations.upgrade(engine) for engine in engines))
    finally:
        for engine in engines:
            await engine.dispose()
    assert sorted(len(names) for names in applied) == [0, 0, len(migrations.discover())]


async def test_changed_applied_file_stops_the_upgrade(empty_database, migrations_dir, tmp_path):
    copy = tmp_path / "stub"
    shutil.copytree(migrations_dir, copy)
    engine = create_engine(empty_database, with_vector_codec=False)
    try:
        await migrations.upgrade(engine, directory=copy)
        first = sorted(copy.glob("*.sql"))[0]
        first.write_text(first.read_text() + "\n-- edited\n")
        with pytest.raises(MigrationError, match="changed after it was applied"):
            await migrations.upgrade(engine, directory=copy)
    finally:
        await engine.dispose()


async def test_failing_file_leaves_nothing_applied(empty_database, migrations_dir, tmp_path):
    copy = tmp_path / "stub"
    shutil.copytree(migrations_dir, copy)
    (copy / "9999_broken.sql").write_text("CREATE TABLE ai.half_done (id INT); SELECT 1/0;")
    engine = create_engine(empty_database, with_vector_codec=False)
    try:
        with pytest.raises(Exception, match="division by zero"):
            await migrations.upgrade(engine, directory=copy)
        async with engine.connect() as conn:
            exists = (
                await conn.execute(text("SELECT to_regclass('ai.context_ai_state')"))
            ).scalar()
        assert exists is None
    finally:
        await engine.dispose()


async def test_vector_columns_match_the_default_profile_dimension(engine):
    """The frozen preset column declares the default dimension; the per-profile preset
    vectors (0050) and context vectors (0060) declare none."""
    async with engine.connect() as conn:
        dimensions = (
            (
                await conn.execute(
                    text(
                        "SELECT DISTINCT format_type(atttypid, atttypmod) FROM pg_attribute "
                        "WHERE attrelid = 'ai.keyword_preset'::regclass "
                        "AND attname = 'embedding'"
                    )
                )
            )
            .scalars()
            .all()
        )
    default_dimension = Settings.model_fields["embedding_dimension"].default
    assert dimensions == [f"vector({default_dimension})"]
    async with engine.connect() as conn:
        per_profile = (
            (
                await conn.execute(
                    text(
                        "SELECT format_type(atttypid, atttypmod) FROM pg_attribute "
                        "WHERE attrelid IN ('ai.keyword_preset_embedding'::regclass, "
                        "'ai.context_embedding'::regclass) AND attname = 'embedding'"
                    )
                )
            )
            .scalars()
            .all()
        )
    assert per_profile == ["vector", "vector"]


async def test_worker_role_has_privileges_on_ai_only(engine):
    async with engine.connect() as conn:
        facts = (
            await conn.execute(
                text("""
                SELECT has_schema_privilege('pinlog_ai_worker', 'ai', 'USAGE') AS ai_usage,
                       has_schema_privilege('pinlog_ai_worker', 'core', 'USAGE') AS core_usage,
                       has_column_privilege('pinlog_ai_worker', 'ai.context_ai_state',
                                            'embedding_status', 'UPDATE') AS state_update,
                       has_table_privilege('pinlog_ai_worker', 'ai.context_ai_state', 'INSERT')
                           AS state_insert,
                       has_table_privilege('pinlog_ai_worker', 'ai.context_ai_state', 'DELETE')
                           AS state_delete,
                       has_table_privilege('pinlog_ai_worker', 'ai.context_keyword', 'DELETE')
                           AS keyword_delete
                """)
            )
        ).one()
    assert facts.ai_usage and facts.state_update and facts.keyword_delete
    # The worker never creates or removes state rows (§0) and cannot reach core.*.
    assert not facts.core_usage and not facts.state_insert and not facts.state_delete
