"""``pinlog_platform.contract.states`` against the schema and the statements that must reach every
stage
(§1, §2, §9).

Adding a stage to ``Stage`` fails here in every place that forgot it: its place in
``STAGE_ORDER`` and ``STAGE_REQUIREMENTS``, its CHECK list, attempt and failure columns in the
schema, the unfinished-rows index, every SQL constant of either service that names a stage's
status column but not its own (opt-out: only ``ONE_STAGE_STATEMENTS`` and the
``PER_STAGE_STATEMENTS`` maps are written for one stage) and each ``PER_STAGE_STATEMENTS`` map
without its statement. Adding a status column to the schema without a ``Stage`` fails too. What
every stage shares is built from ``STAGE_ORDER`` rather than spelled out by hand: the cancel is
one SET, lists of every stage's statuses are generated, and no code picks one of two stages.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from sqlalchemy import TextClause, text

import app
import core_service
import core_service.repository
from app.repository.named_statements import NamedStatement
from core_service.repository.context_ai_state import CANCEL_EVERY_STAGE, CANCEL_STATES
from pinlog_platform.contract.states import (
    CLAIMABLE,
    CORE_TRANSITIONS,
    ONE_STAGE_STATEMENTS,
    PER_STAGE_STATEMENTS,
    STAGE_ORDER,
    STAGE_REQUIREMENTS,
    WORKER_TRANSITIONS,
    CoreOperation,
    Stage,
    Status,
)

ROOT = Path(__file__).resolve().parents[2]
SERVICES = (app, core_service)

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
    columns = [
        c
        for stage in Stage
        for c in (stage.status_column, stage.attempt_column, stage.failure_column)
    ]
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


def _assigned_names(path: str) -> set[str]:
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    return {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }


def _service_statements() -> Iterator[tuple[str, object]]:
    """Every SQL constant of both services, as ``("module:attribute", statement)``; a
    ``{Stage: statement}`` map yields each statement as ``"module:attribute[STAGE]"``, and a
    statement of a map is found only through its map."""
    for package in SERVICES:
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            module = importlib.import_module(info.name)
            owned = {  # imported constants are found in the module that owns them
                name: value
                for name, value in vars(module).items()
                if name in _assigned_names(module.__file__)
            }
            maps = {
                name: value
                for name, value in owned.items()
                if isinstance(value, Mapping) and value and all(isinstance(k, Stage) for k in value)
            }
            in_maps = {id(statement) for value in maps.values() for statement in value.values()}
            for name, value in owned.items():
                if isinstance(value, TextClause | NamedStatement) and id(value) not in in_maps:
                    yield f"{info.name}:{name}", value
            for name, value in maps.items():
                for stage, statement in value.items():
                    yield f"{info.name}:{name}[{stage.name}]", statement


STATEMENTS = dict(_service_statements())
STAGE_STATEMENTS = {
    reference: statement
    for reference, statement in STATEMENTS.items()
    if any(_names(_sql(statement), stage.status_column) for stage in Stage)
}


def _declared_stage(reference: str) -> Stage | None:
    """The one stage ``reference`` is written for: ``ONE_STAGE_STATEMENTS`` or its map's key."""
    if reference.endswith("]"):
        return Stage[reference.rsplit("[", 1)[1][:-1]]
    return ONE_STAGE_STATEMENTS.get(reference)


def test_the_scan_finds_the_statements_of_both_services():
    """The opt-out below is only as wide as the scan: it must see both services' statements."""
    assert "core_service.repository.context_ai_state:CANCEL_STATES" in STAGE_STATEMENTS
    assert "app.repository.context_start:START_CONTEXT" in STAGE_STATEMENTS
    assert "app.repository.context_ai_state:CLAIM_STAGE[KEYWORD]" in STAGE_STATEMENTS
    assert len(STAGE_STATEMENTS) >= 30


@pytest.mark.parametrize("reference", sorted(ONE_STAGE_STATEMENTS))
def test_each_one_stage_declaration_names_a_statement_of_its_stage(reference):
    assert reference in STATEMENTS, "declared but no such statement"
    assert _names(_sql(STATEMENTS[reference]), ONE_STAGE_STATEMENTS[reference].status_column)


@pytest.mark.parametrize("reference", sorted(STAGE_STATEMENTS))
def test_statement_names_every_stage_status_column_unless_declared_per_stage(reference):
    """Opt-out: a SQL constant naming one stage's status column names every stage's, or is
    declared for one stage (``ONE_STAGE_STATEMENTS``, a ``{Stage: statement}`` map)."""
    sql = _sql(STAGE_STATEMENTS[reference])
    declared = _declared_stage(reference)
    if declared is not None:
        assert _names(sql, declared.status_column)
    else:
        assert [stage for stage in Stage if not _names(sql, stage.status_column)] == []


ALL_STAGE_STATEMENTS = sorted(r for r in STAGE_STATEMENTS if _declared_stage(r) is None)


@pytest.mark.parametrize("reference", ALL_STAGE_STATEMENTS)
def test_statement_quotes_only_statuses_of_the_vocabulary(reference):
    """A misspelt status in a read (``= 'CANCELED'``) matches nothing and no CHECK sees it. A
    module may declare the other words its statements quote (``NON_STATUS_LITERALS``)."""
    module = importlib.import_module(reference.split(":")[0])
    declared = getattr(module, "NON_STATUS_LITERALS", frozenset())
    assert not declared & STATUS_VALUES
    assert _quoted(_sql(STAGE_STATEMENTS[reference])) - declared <= STATUS_VALUES


_STATUS_COLUMN = "(?:\\w+\\.)?(?:" + "|".join(stage.status_column for stage in Stage) + ")"
# A SET list (up to the clause after it) assigning CANCELLED to a stage's status column.
_SETS_CANCELLED = re.compile(
    rf"\bSET\b(?:(?!\b(?:FROM|WHERE|RETURNING)\b).)*?\b{_STATUS_COLUMN}\s*=\s*'{Status.CANCELLED}'",
    re.IGNORECASE | re.DOTALL,
)
# Stages' status columns listed by hand as the values an IN tests (``'FAILED' IN (s.a, s.b)``).
_LISTS_STAGES = re.compile(rf"\bIN\s*\(\s*{_STATUS_COLUMN}\s*,\s*{_STATUS_COLUMN}\b", re.IGNORECASE)


def _service_source_literals() -> Iterator[tuple[str, str]]:
    """``(module path, text)`` of every string literal in both services' source."""
    for package in SERVICES:
        for path in sorted(Path(package.__path__[0]).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    yield str(path.relative_to(ROOT)), node.value


def test_every_cancel_is_the_one_cancel_of_every_stage():
    """§9 Delete, ``CoreOperation.CANCEL``: a statement that cancels a stage sets every stage
    ``CANCELLED`` through ``CANCEL_EVERY_STAGE`` (built from the stage order), and no source
    spells a cancel out by hand, so a new stage is cancelled wherever a context is."""
    assert _SETS_CANCELLED.search(CANCEL_EVERY_STAGE)
    assert all(_names(CANCEL_EVERY_STAGE, stage.status_column) for stage in Stage)
    cancelling = [r for r, st in STATEMENTS.items() if _SETS_CANCELLED.search(_sql(st))]
    assert "core_service.repository.context_ai_state:CANCEL_STATES" in cancelling
    assert [r for r in cancelling if CANCEL_EVERY_STAGE not in _sql(STATEMENTS[r])] == []
    assert CANCEL_EVERY_STAGE in CANCEL_STATES.text
    by_hand = [
        path for path, literal in _service_source_literals() if _SETS_CANCELLED.search(literal)
    ]
    assert by_hand == []


def test_no_source_lists_the_stages_statuses_by_hand():
    """A list of every stage's statuses that a value is tested against (the record-state CASE's
    ``'FAILED' IN (...)``, doctor's stale ``PROCESSING``) is built from ``STAGE_ORDER`` at
    import: one written by hand would leave out a new stage."""
    by_hand = [
        (path, match.group(0))
        for path, literal in _service_source_literals()
        for match in _LISTS_STAGES.finditer(literal)
    ]
    assert by_hand == []


def _compares_with_one_stage(test: ast.expr) -> bool:
    return any(
        isinstance(node, ast.Compare)
        and any(
            isinstance(c, ast.Attribute) and isinstance(c.value, ast.Name) and c.value.id == "Stage"
            for c in (node.left, *node.comparators)
        )
        for node in ast.walk(test)
    )


def test_no_code_picks_one_of_two_stages():
    """``x if stage is Stage.EMBEDDING else y`` answers ``y`` for every other stage, a third
    one included: per-stage values are mappings by stage (``record_view.AiStatuses``)."""
    found = []
    for package in SERVICES:
        for path in sorted(Path(package.__path__[0]).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (
                    isinstance(node, ast.IfExp | ast.If)
                    and node.orelse
                    and _compares_with_one_stage(node.test)
                ):
                    found.append((str(path.relative_to(ROOT)), node.lineno))
    assert found == []


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
    """Every ``*_status``, ``*_attempt`` and ``*_failure`` column is a ``Stage``'s; status and
    attempt default to the start of the stage (``PENDING``, attempt 0) and are ``NOT NULL``."""
    async with engine.connect() as conn:
        columns = {row.column_name: row for row in (await conn.execute(STATE_COLUMNS)).all()}
    assert {c for c in columns if c.endswith("_status")} == {s.status_column for s in Stage}
    assert {c for c in columns if c.endswith("_attempt")} == {s.attempt_column for s in Stage}
    assert {c for c in columns if c.endswith("_failure")} == {s.failure_column for s in Stage}
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
