"""``pinlog_platform.states`` against the schema and the statements that must reach every stage
(§1, §2, §9).

Adding a stage to ``Stage`` fails here in every place that forgot it: its place in
``STAGE_ORDER`` and ``STAGE_REQUIREMENTS``, its CHECK list and attempt column in the schema, the
unfinished-rows index, each statement of ``ALL_STAGE_STATEMENTS`` that does not name its status
column and each ``PER_STAGE_STATEMENTS`` map without its statement. Adding a status column to
the schema without a ``Stage`` fails too.
"""

from __future__ import annotations

import importlib
import pkgutil
import re

import pytest
from sqlalchemy import TextClause, text

import core_service.repository
from pinlog_platform.db.named_statements import NamedStatement
from pinlog_platform.states import (
    ALL_STAGE_STATEMENTS,
    CLAIMABLE,
    CORE_TRANSITIONS,
    PER_STAGE_STATEMENTS,
    STAGE_ORDER,
    STAGE_REQUIREMENTS,
    WORKER_TRANSITIONS,
    CoreOperation,
    Stage,
    Status,
)

STATUS_VALUES = {status.value for status in Status}

# Single-column CHECK constraints of the state table, with the column they constrain.
COLUMN_CHECKS = text(
    """
    SELECT a.attname AS column_name, pg_get_constraintdef(c.oid) AS definition
    FROM pg_constraint AS c
    JOIN pg_attribute AS a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
    WHERE c.conrelid = 'ai.context_ai_state'::regclass AND c.contype = 'c'
      AND cardinality(c.conkey) = 1
    """
)
STATE_COLUMNS = text(
    """
    SELECT column_name, data_type, is_nullable, column_default
    FROM information_schema.columns
    WHERE table_schema = 'ai' AND table_name = 'context_ai_state'
    """
)
STATE_INDEXES = text(
    "SELECT indexname, indexdef FROM pg_indexes "
    "WHERE schemaname = 'ai' AND tablename = 'context_ai_state'"
)


def _resolve(reference: str) -> object:
    module_name, attribute = reference.split(":")
    return getattr(importlib.import_module(module_name), attribute)


def _sql(statement: object) -> str:
    if isinstance(statement, TextClause):
        return statement.text
    if isinstance(statement, NamedStatement):
        return statement.sql
    assert isinstance(statement, str), f"not a SQL statement: {type(statement).__name__}"
    return statement


def _names(sql: str, column: str) -> bool:
    return re.search(rf"\b{re.escape(column)}\b", sql) is not None


def _quoted(sql: str) -> set[str]:
    return set(re.findall(r"'([^']*)'", sql))


# The declarations.


def test_stage_order_declares_every_stage_once():
    assert sorted(STAGE_ORDER) == sorted(Stage)
    assert len(set(STAGE_ORDER)) == len(STAGE_ORDER)


def test_a_stage_requires_only_statuses_of_stages_before_it():
    assert set(STAGE_REQUIREMENTS) == set(Stage)
    for position, stage in enumerate(STAGE_ORDER):
        assert set(stage.requires) <= set(STAGE_ORDER[:position]), stage


def test_the_keyword_stage_requires_a_completed_embedding():
    """§2 "Start": the keyword stage adds ``AND embedding_status = 'COMPLETED'``."""
    assert dict(Stage.EMBEDDING.requires) == {}
    assert dict(Stage.KEYWORD.requires) == {Stage.EMBEDDING: Status.COMPLETED}


def test_every_stage_has_columns_of_its_own():
    columns = [c for stage in Stage for c in (stage.status_column, stage.attempt_column)]
    assert len(set(columns)) == len(columns)
    assert all(Stage(stage.status_column) is stage for stage in Stage)


def test_each_side_writes_only_the_statuses_section_0_gives_it():
    """§0: the worker writes ``PROCESSING``, ``COMPLETED``, ``FAILED``; the core creates
    ``PENDING``, cancels and finalizes. Neither moves a finished stage but the core's cancel
    and its operational reset (§0: ``COMPLETED -> PENDING``, the keyword stage of a preset
    reclassification), which moves nothing else."""
    assert {after for _, after in WORKER_TRANSITIONS} <= {
        Status.PROCESSING,
        Status.COMPLETED,
        Status.FAILED,
    }
    assert {before for before, _ in WORKER_TRANSITIONS} <= CLAIMABLE
    assert set(CORE_TRANSITIONS) == set(CoreOperation)
    for operation, moves in CORE_TRANSITIONS.items():
        assert {after for _, after in moves} <= {
            Status.PENDING,
            Status.FAILED,
            Status.CANCELLED,
        }, operation
        if operation is CoreOperation.REPROCESS_KEYWORDS:
            assert moves == {(Status.COMPLETED, Status.PENDING)}
        elif operation is not CoreOperation.CANCEL:
            assert {before for before, _ in moves} <= CLAIMABLE | {None}, operation


# The statements.


@pytest.mark.parametrize("reference", ALL_STAGE_STATEMENTS)
def test_statement_names_every_stage_status_column(reference):
    sql = _sql(_resolve(reference))
    assert [stage for stage in Stage if not _names(sql, stage.status_column)] == []


@pytest.mark.parametrize("reference", ALL_STAGE_STATEMENTS)
def test_statement_quotes_only_statuses_of_the_vocabulary(reference):
    """A misspelt status in a read (``= 'CANCELED'``) matches nothing and no CHECK sees it. A
    module may declare the other words its statements quote (``NON_STATUS_LITERALS``)."""
    module = importlib.import_module(reference.split(":")[0])
    declared = getattr(module, "NON_STATUS_LITERALS", frozenset())
    assert not declared & STATUS_VALUES
    assert _quoted(_sql(_resolve(reference))) - declared <= STATUS_VALUES


@pytest.mark.parametrize("reference", PER_STAGE_STATEMENTS)
def test_per_stage_map_has_every_stage_and_names_its_columns(reference):
    """docs/state-machine.md "Attempts": a claim takes its stage's next attempt, a fail is
    fenced by it; neither names another stage's attempt."""
    statements = _resolve(reference)
    assert set(statements) == set(Stage)
    for stage, statement in statements.items():
        sql = _sql(statement)
        assert _names(sql, stage.status_column), stage
        assert [other for other in Stage if _names(sql, other.attempt_column)] == [stage]


def test_the_core_never_names_an_attempt_column():
    """Only the worker's claims write attempts (``0008_stage_attempts.sql``): a core statement
    that reset one would let a superseded attempt store its result."""
    found = []
    for module_info in pkgutil.iter_modules(core_service.repository.__path__):
        module = importlib.import_module(f"core_service.repository.{module_info.name}")
        for name, value in vars(module).items():
            if not name.startswith("__") and isinstance(value, TextClause | str):
                sql = _sql(value)
                found += [(module_info.name, name) for s in Stage if _names(sql, s.attempt_column)]
    assert found == []


# The schema.


async def test_every_stage_column_checks_exactly_the_statuses(engine):
    """§1: both columns ``CHECK IN`` the five states; the CHECK lists are ``Status``."""
    async with engine.connect() as conn:
        checks = (await conn.execute(COLUMN_CHECKS)).all()
    for stage in Stage:
        definitions = [row.definition for row in checks if row.column_name == stage.status_column]
        assert len(definitions) == 1, stage
        assert _quoted(definitions[0]) == STATUS_VALUES, stage


async def test_the_schema_has_no_stage_columns_the_vocabulary_lacks(engine):
    """Every ``*_status`` and ``*_attempt`` column is a ``Stage``'s; each defaults to the start
    of its stage (``PENDING``, attempt 0) and is ``NOT NULL``."""
    async with engine.connect() as conn:
        columns = {row.column_name: row for row in (await conn.execute(STATE_COLUMNS)).all()}
    assert {c for c in columns if c.endswith("_status")} == {s.status_column for s in Stage}
    assert {c for c in columns if c.endswith("_attempt")} == {s.attempt_column for s in Stage}
    for stage in Stage:
        status, attempt = columns[stage.status_column], columns[stage.attempt_column]
        assert _quoted(status.column_default) == {Status.PENDING.value}, stage
        assert (attempt.data_type, attempt.column_default) == ("integer", "0"), stage
        assert status.is_nullable == attempt.is_nullable == "NO", stage


async def test_indexes_reach_every_stage(engine):
    """§1: an index on ``(<stage>, updated_at)`` per stage; the rescan's unfinished-rows index
    (``0006``) lists every stage with the claimable statuses."""
    async with engine.connect() as conn:
        indexes = dict((await conn.execute(STATE_INDEXES)).all())
    for stage in Stage:
        assert any(f"({stage.status_column}, updated_at)" in d for d in indexes.values()), stage
    unfinished = indexes["context_ai_state_unfinished_idx"].split(" WHERE ", 1)[1]
    assert [stage for stage in Stage if not _names(unfinished, stage.status_column)] == []
    assert _quoted(unfinished) == {status.value for status in CLAIMABLE}
