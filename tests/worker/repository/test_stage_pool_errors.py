"""How ``StagePool.fetch_row`` classifies driver errors (§6): a lost connection is transient,
a wrong call on a live connection is a bug of ours and says so, never quoting arguments."""

from __future__ import annotations

import pytest

from app.errors import DatabaseStatementError, DatabaseUnavailable, TransientError
from app.repository.stage_pool import StagePool

MARKER = "argument-marker-7f3a"


async def test_a_wrong_argument_count_is_a_statement_error_not_a_transient_one(stage_pool):
    with pytest.raises(DatabaseStatementError) as raised:
        await stage_pool.fetch_row("SELECT CAST($1 AS text), CAST($2 AS text)", MARKER)
    assert not isinstance(raised.value, TransientError)
    assert "InterfaceError" in str(raised.value)
    assert MARKER not in str(raised.value) and raised.value.__suppress_context__


async def test_an_argument_the_driver_cannot_encode_is_a_statement_error(stage_pool):
    with pytest.raises(DatabaseStatementError) as raised:
        await stage_pool.fetch_row("SELECT CAST($1 AS bigint)", MARKER)
    assert "DataError" in str(raised.value)
    assert MARKER not in str(raised.value) and raised.value.__suppress_context__


async def test_the_pool_still_serves_after_a_statement_error(stage_pool):
    with pytest.raises(DatabaseStatementError):
        await stage_pool.fetch_row("SELECT CAST($1 AS bigint)", MARKER)
    assert await stage_pool.fetch_row("SELECT 1") == (1,)


async def test_a_closed_pool_is_unavailable(migrated_database):
    pool = await StagePool.open(migrated_database, size=1)
    await pool.close()
    with pytest.raises(DatabaseUnavailable):
        await pool.fetch_row("SELECT 1")
