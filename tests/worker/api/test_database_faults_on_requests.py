"""The worker's request paths: a data exception (SQLSTATE class 22) of a statement bound to a
caller's values is 422; any other database error is 500 with one ERROR line naming its class
and SQLSTATE only, never the driver's message. Real HTTP, real PostgreSQL: the fault is the
database's own (a renamed table), nothing is patched."""

from __future__ import annotations

import logging

import pytest
from sqlalchemy import text

from app.errors import InvalidInputError
from app.repository.db import autocommit, client_autocommit
from tests.worker.harness import PROFILE, SECRET

OUT_OF_RANGE = text("SELECT CAST(:value AS bigint)")


async def test_a_data_exception_is_the_requests_fault_only_where_its_values_are_bound(engine):
    with pytest.raises(InvalidInputError, match="22"):
        async with client_autocommit(engine) as conn:
            await conn.execute(OUT_OF_RANGE, {"value": 2**63})
    with pytest.raises(Exception, match="22") as raised:
        async with autocommit(engine) as conn:
            await conn.execute(OUT_OF_RANGE, {"value": 2**63})
    assert not isinstance(raised.value, InvalidInputError)


async def test_a_search_meeting_a_database_fault_is_500_with_one_error_line(engine, worker, caplog):
    async with engine.begin() as conn:
        await conn.execute(text("ALTER TABLE ai.context_embedding RENAME TO context_embedding_x"))
    try:
        answer = await worker.client.post(
            "/internal/v1/search",
            json={"userId": 1, "query": "카페", "embeddingProfile": PROFILE},
            headers={"X-Internal-Secret": SECRET},
        )
    finally:
        async with engine.begin() as conn:
            await conn.execute(
                text("ALTER TABLE ai.context_embedding_x RENAME TO context_embedding")
            )
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert answer.status_code == 500
    assert answer.json() == {"detail": "internal error"}
    assert [r.getMessage() for r in errors] == ["internal error: ProgrammingError (SQLSTATE 42P01)"]
    assert all(r.exc_info is None for r in errors)
