"""A data exception (SQLSTATE class 22) of a statement bound to a client's input answers 422;
any other database fault answers 500 with one ERROR line naming only its SQLSTATE
(``core_service/repository/db.py``). Real HTTP, real PostgreSQL: the faults are raised by the
database itself (a trigger, a renamed table), nothing is patched."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import text

from core_service.errors import DatabaseFault, InvalidInputError
from core_service.repository.db import autocommit, client_autocommit
from tests.core.harness import bearer

OUT_OF_RANGE = text("SELECT CAST(:value AS bigint)")

RAISE_22003 = [
    "CREATE FUNCTION core.test_out_of_range() RETURNS trigger LANGUAGE plpgsql AS "
    "$$ BEGIN RAISE EXCEPTION 'out of range' USING ERRCODE = '22003'; END $$",
    "CREATE TRIGGER test_out_of_range BEFORE INSERT ON core.context "
    "FOR EACH ROW EXECUTE FUNCTION core.test_out_of_range()",
]
DROP_22003 = [
    "DROP TRIGGER test_out_of_range ON core.context",
    "DROP FUNCTION core.test_out_of_range()",
]


async def _ddl(engine, statements: list[str]) -> None:
    async with engine.begin() as conn:
        for statement in statements:
            await conn.execute(text(statement))


async def test_a_data_exception_is_the_inputs_fault_only_where_client_input_is_bound(engine):
    with pytest.raises(InvalidInputError, match="22"):
        async with client_autocommit(engine) as conn:
            await conn.execute(OUT_OF_RANGE, {"value": 2**63})
    with pytest.raises(DatabaseFault, match="22"):
        async with autocommit(engine) as conn:
            await conn.execute(OUT_OF_RANGE, {"value": 2**63})


async def test_a_create_the_database_refuses_with_a_data_exception_answers_422(
    make_core, fake_worker, engine, caplog
):
    await _ddl(engine, RAISE_22003)
    try:
        async with make_core(fake_worker.base_url) as core:
            answer = await core.create(1, "메모")
    finally:
        await _ddl(engine, DROP_22003)
    assert answer.status_code == 422
    assert "메모" not in answer.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_any_other_database_fault_answers_500_with_one_error_line(
    make_core, fake_worker, engine, caplog
):
    async with make_core(fake_worker.base_url) as core:
        await _ddl(engine, ["ALTER TABLE core.record RENAME TO record_away"])
        try:
            answer = await core.client.get("/api/v1/records", headers=bearer(1))
        finally:
            await _ddl(engine, ["ALTER TABLE core.record_away RENAME TO record"])
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert answer.status_code == 500
    assert errors == ["internal error: DatabaseFault: database error 42P01"]
