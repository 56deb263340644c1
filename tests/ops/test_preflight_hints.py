"""Which migration a not-ready database needs, from real driver errors on an empty database:
a missing ``ai`` table points at ``pinlog-ai db upgrade``, a missing ``core`` table at
``pinlog-core db upgrade`` (the worker's upgrade skips the core's files)."""

from __future__ import annotations

import pytest
from sqlalchemy import exc as sa_exc
from sqlalchemy import text

from app import preflight
from app.repository.db import create_engine
from pinlog_platform.cli import exit_codes


async def _error_of(url: str, statement: str) -> BaseException:
    engine = create_engine(url, pool_size=1, with_vector_codec=False)
    try:
        async with engine.connect() as conn:
            with pytest.raises(sa_exc.DBAPIError) as raised:
                await conn.execute(text(statement))
        return raised.value
    finally:
        await engine.dispose()


async def test_a_missing_core_table_names_the_cores_upgrade(empty_database):
    async def problem(statement):
        return preflight.classify(await _error_of(empty_database, statement))

    core = await problem("SELECT 1 FROM core.context")
    ai = await problem("SELECT 1 FROM ai.keyword_preset")

    assert core.exit_code == ai.exit_code == exit_codes.DATABASE_NOT_READY
    assert "`pinlog-core db upgrade`" in core.message
    assert "`pinlog-ai db upgrade`" in ai.message
