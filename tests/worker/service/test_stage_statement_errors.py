"""A stage statement the database refuses for good (§6): classified, and quiet about its data.

The refusal is made real with a CHECK constraint that rejects one marker text in the judge's
``unmatchedConcepts`` (model output that reaches the keyword save as a parameter). PostgreSQL
quotes the failing row in the error's DETAIL; none of it may reach a log line, a formatted
traceback or the exception chain a log handler walks.
"""

from __future__ import annotations

import logging
import traceback

import pytest
from sqlalchemy import text

from app.errors import DatabaseStatementError
from app.repository import context_ai_state, stage_saves
from app.repository.named_statements import compile_named
from pinlog_platform.contract.states import Stage
from tests.fake_openai import Scripted, judge_body
from tests.worker.support import PROFILE, fetch_state, make_state

MARKER = "MARKER-7c1e-private-concept"
NOTE = "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음."
ADD_CHECK = text(
    "ALTER TABLE ai.context_keyword_analysis ADD CONSTRAINT refuses_the_marker "
    f"CHECK (unmatched_concepts::text NOT LIKE '%{MARKER}%') NOT VALID"
)
DROP_CHECK = text(
    "ALTER TABLE ai.context_keyword_analysis DROP CONSTRAINT IF EXISTS refuses_the_marker"
)
SELECT_ONE = compile_named("SELECT 1 AS one")


@pytest.fixture
async def refusing_table(engine):
    async with engine.begin() as conn:
        await conn.execute(ADD_CHECK)
    yield
    async with engine.begin() as conn:
        await conn.execute(DROP_CHECK)


def _chain(exc: BaseException) -> list[BaseException]:
    """The exceptions a traceback printer or error reporter shows with ``exc``."""
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        if current.__cause__ is not None:
            current = current.__cause__
        elif not current.__suppress_context__:
            current = current.__context__
        else:
            current = None
    return seen


async def test_the_refused_save_names_only_its_sqlstate(engine, stage_pool, refusing_table):
    await make_state(engine, context_id=1, embedding_status="COMPLETED")
    claim = await context_ai_state.claim(stage_pool, Stage.KEYWORD, 1, expiry_seconds=600)

    with pytest.raises(DatabaseStatementError) as raised:
        await stage_saves.save_keywords(
            stage_pool,
            context_id=1,
            attempt=claim.attempt,
            selections=(),
            preset_version=1,
            unmatched_concepts=(MARKER,),
            model_profile="profile",
            embedding_profile=PROFILE,
        )

    assert "23514" in str(raised.value)
    printed = "".join(traceback.format_exception(raised.value))
    assert MARKER not in printed
    for exc in _chain(raised.value):
        assert MARKER not in str(exc) and MARKER not in repr(exc)
    assert await fetch_state(engine, 1) == ("COMPLETED", "PROCESSING")
    # The pool connection is fine after the refusal.
    assert (await stage_pool.fetch_row(SELECT_ONE))["one"] == 1


async def test_the_worker_logs_the_refusal_without_the_model_output(
    engine, worker, fake_openai, refusing_table, caplog
):
    await make_state(engine, context_id=1)
    fake_openai.script_judge(Scripted(json=judge_body([], unmatched=[MARKER])))

    with caplog.at_level(logging.DEBUG):
        await worker.process(1, NOTE)

    assert await fetch_state(engine, 1) == ("COMPLETED", "PROCESSING")
    formatter = logging.Formatter()
    logged = [formatter.format(record) for record in caplog.records]
    assert any("23514" in line for line in logged), "the refusal was not logged"
    assert not [line for line in logged if MARKER in line]
