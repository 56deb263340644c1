"""The failure reason codes: ``FailureReason`` equals the CHECK list of both new
columns; rows ``FAILED`` before ``0010`` read as ``unknown``; the worker's role is granted
exactly the two columns it writes."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from sqlalchemy import text

from app.repository.db import create_engine
from pinlog_platform.contract import schema as migrations
from pinlog_platform.contract.states import Stage
from pinlog_platform.contract.states.failure_reasons import FAILURE_COLUMNS, FailureReason

MIGRATION = "0010_stage_failure_reasons.sql"


def _migration() -> str:
    return (migrations.runner.bundled_directory() / MIGRATION).read_text()


def test_each_column_checks_exactly_the_reason_codes():
    sql = _migration()
    for column in FAILURE_COLUMNS.values():
        listed = re.search(
            rf"{column} VARCHAR\(30\) NULL.*?CHECK \({column} IN \((.*?)\)\)", sql, re.S
        )
        assert listed is not None, column
        assert set(re.findall(r"'([a-z_]+)'", listed[1])) == {r.value for r in FailureReason}


def test_every_stage_has_a_reason_column():
    assert set(FAILURE_COLUMNS) == {stage.value for stage in Stage}


async def test_rows_failed_before_the_migration_read_unknown(empty_database, tmp_path: Path):
    before = tmp_path / "before"
    before.mkdir()
    for file in migrations.discover():
        if file.filename < MIGRATION:
            shutil.copy(migrations.runner.bundled_directory() / file.filename, before)
    engine = create_engine(empty_database, with_vector_codec=False)
    try:
        await migrations.upgrade(engine, directory=before)
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO ai.context_ai_state (context_id, embedding_status, "
                    "keyword_status) VALUES (1, 'FAILED', 'FAILED'), (2, 'COMPLETED', 'FAILED'),"
                    " (3, 'COMPLETED', 'COMPLETED')"
                )
            )
        assert await migrations.upgrade(engine) == [
            f.filename for f in migrations.discover() if f.filename >= MIGRATION
        ]
        async with engine.connect() as conn:
            rows = (
                await conn.execute(
                    text(
                        "SELECT context_id, embedding_failure, keyword_failure "
                        "FROM ai.context_ai_state ORDER BY context_id"
                    )
                )
            ).all()
            granted = (
                await conn.execute(
                    text(
                        "SELECT column_name FROM information_schema.column_privileges "
                        "WHERE grantee = 'pinlog_ai_worker' AND table_schema = 'ai' "
                        "AND table_name = 'context_ai_state' AND privilege_type = 'UPDATE' "
                        "AND column_name LIKE '%failure'"
                    )
                )
            ).scalars()
            assert set(granted) == set(FAILURE_COLUMNS.values())
    finally:
        await engine.dispose()
    assert [tuple(row) for row in rows] == [
        (1, "unknown", "unknown"),
        (2, None, "unknown"),
        (3, None, None),
    ]
