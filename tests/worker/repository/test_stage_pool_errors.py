"""How ``StagePool.fetch_row`` classifies driver errors (§6): a lost connection is transient,
a wrong call on a live connection is a bug of ours and says so, never quoting arguments."""

from __future__ import annotations

import pytest

from app.errors import DatabaseStatementError, DatabaseUnavailable, TransientError
from app.repository.named_statements import NamedStatement, compile_named
from app.repository.stage_pool import StagePool

MARKER = "argument-marker-7f3a"
SELECT_ONE = compile_named("SELECT 1")
AS_BIGINT = compile_named("SELECT CAST(:value AS bigint)")
TWO_TEXTS = compile_named("SELECT CAST(:first AS text), CAST(:second AS text)")
# Built by hand, not compiled: the driver itself sees one argument for two parameters.
ONE_NAME_FOR_TWO_PARAMETERS = NamedStatement(
    "SELECT CAST($1 AS text), CAST($2 AS text)", ("first",)
)


async def test_a_missing_keyword_is_refused_before_any_statement_runs(stage_pool):
    before = stage_pool.statements_run
    with pytest.raises(TypeError, match=r"missing second; unexpected secnod$") as raised:
        await stage_pool.fetch_row(TWO_TEXTS, first=MARKER, secnod=MARKER)
    assert MARKER not in str(raised.value)
    assert stage_pool.statements_run == before


async def test_a_wrong_argument_count_is_a_statement_error_not_a_transient_one(stage_pool):
    with pytest.raises(DatabaseStatementError) as raised:
        await stage_pool.fetch_row(ONE_NAME_FOR_TWO_PARAMETERS, first=MARKER)
    assert not isinstance(raised.value, TransientError)
    assert "InterfaceError" in str(raised.value)
    assert MARKER not in str(raised.value) and raised.value.__suppress_context__


async def test_an_argument_the_driver_cannot_encode_is_a_statement_error(stage_pool):
    with pytest.raises(DatabaseStatementError) as raised:
        await stage_pool.fetch_row(AS_BIGINT, value=MARKER)
    assert "DataError" in str(raised.value)
    assert MARKER not in str(raised.value) and raised.value.__suppress_context__


async def test_the_pool_still_serves_after_a_statement_error(stage_pool):
    with pytest.raises(DatabaseStatementError):
        await stage_pool.fetch_row(AS_BIGINT, value=MARKER)
    assert await stage_pool.fetch_row(SELECT_ONE) == (1,)


async def test_a_closed_pool_is_unavailable(migrated_database):
    pool = await StagePool.open(migrated_database, size=1)
    await pool.close()
    with pytest.raises(DatabaseUnavailable):
        await pool.fetch_row(SELECT_ONE)
