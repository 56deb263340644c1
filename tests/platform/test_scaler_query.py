"""The autoscaler's query (``pinlog_platform/contract/scaler.py``) on the real PostgreSQL: what
it counts per profile, its cap, its plan (index-only scans, nothing else read) and the role
that runs it (``0106_core_scaler_role.sql``)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import create_async_engine

from pinlog_platform.contract.scaler import SCALER_ROLE, SCALER_WORK, WORK_CAP, render
from tests.parallel_databases import ensure_login_role

IN_USE = "alpha-model-1536-cosine-v1"
OTHER = "beta-model-1536-cosine-v1"

INSERT_STATE = text(
    "INSERT INTO ai.context_ai_state (context_id, embedding_status, keyword_status, updated_at, "
    "keyword_reprocess_version, keyword_via_batch) "
    "VALUES (:id, :e, :k, now() - make_interval(secs => :ago), :rv, :via)"
)
INSERT_BACKFILL = text(
    "INSERT INTO ai.context_embedding_backfill (embedding_profile, context_id, status, batch_id) "
    "VALUES (:profile, :id, :status, :batch)"
)
HELD = "batch_held"  # a PROCESSING row a provider batch holds
SWITCH = text(
    "INSERT INTO core.embedding_switch (profile_in_use, other_profile, state) "
    "VALUES (:in_use, :other, 'cut_over')"
)
# (embedding, keyword, seconds since the last change, reprocess version, marked for a
# provider batch (keyword_via_batch), work?)
STATES = [
    ("PENDING", "PENDING", 0, None, False, True),
    ("PROCESSING", "PENDING", 0, None, False, True),  # held by a worker, within the expiry
    ("PROCESSING", "PENDING", 3600, None, False, True),  # past the expiry: status's backlog
    ("COMPLETED", "PENDING", 0, None, False, True),
    ("COMPLETED", "PROCESSING", 0, None, False, True),
    ("COMPLETED", "PENDING", 0, 2, False, True),  # a reprocessed keyword stage
    # A reprocess by batch: the provider judges these (held, or about to be submitted).
    ("COMPLETED", "PROCESSING", 0, 2, True, False),
    ("COMPLETED", "PENDING", 0, 2, True, False),
    ("COMPLETED", "COMPLETED", 0, None, False, False),
    ("COMPLETED", "FAILED", 0, None, False, False),
    ("FAILED", "PENDING", 0, None, False, False),  # nothing will run: the keyword waits for nothing
    ("CANCELLED", "CANCELLED", 0, None, False, False),
]
BACKFILL = {
    OTHER: ["PENDING", "PENDING", "PROCESSING", HELD, "COMPLETED", "FAILED", "CANCELLED"],
    IN_USE: ["PENDING", "COMPLETED", HELD],
}


async def _work(engine, profile: str) -> int:
    async with engine.connect() as conn:
        bound = (
            await conn.execute(SCALER_WORK, {"profile": profile, "default_profile": IN_USE})
        ).scalar_one()
        # What KEDA sends: the same statement with literals.
        rendered = (
            await conn.exec_driver_sql(render(profile, default_profile=IN_USE))
        ).scalar_one()
    assert bound == rendered
    return int(bound)


async def _seed_states(engine) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            INSERT_STATE,
            [
                {"id": i, "e": e, "k": k, "ago": float(ago), "rv": rv, "via": via}
                for i, (e, k, ago, rv, via, _work) in enumerate(STATES, start=1)
            ],
        )
        for profile, statuses in BACKFILL.items():
            await conn.execute(
                INSERT_BACKFILL,
                [
                    {"profile": profile, "id": i, "status": "PROCESSING", "batch": "batch_1"}
                    if status == HELD
                    else {"profile": profile, "id": i, "status": status, "batch": None}
                    for i, status in enumerate(statuses, start=1)
                ],
            )


async def test_a_profile_counts_the_live_work_while_in_use_and_its_open_backfill(engine):
    """Open backfill rows count, except those a provider batch holds (HELD); live stages
    count, except the keyword stages a reprocess by batch marked."""
    await _seed_states(engine)
    live = sum(1 for *_, work in STATES if work)
    assert live == 6
    assert await _work(engine, IN_USE) == live + 1
    assert await _work(engine, OTHER) == 3

    # After a cutover the live stages are the other profile's work.
    async with engine.begin() as conn:
        await conn.execute(SWITCH, {"in_use": OTHER, "other": IN_USE})
    assert await _work(engine, IN_USE) == 1
    assert await _work(engine, OTHER) == live + 3


async def test_the_count_stops_at_the_cap(engine):
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO ai.context_ai_state (context_id) "
                "SELECT g FROM generate_series(1, :n) AS g"
            ),
            {"n": WORK_CAP + 100},
        )
        await conn.execute(
            INSERT_BACKFILL,
            [{"profile": IN_USE, "id": i, "status": "PENDING", "batch": None} for i in (1, 2)],
        )
    assert await _work(engine, IN_USE) == WORK_CAP
    assert render(IN_USE, default_profile=IN_USE).count(f"LIMIT {WORK_CAP}") == 3


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found += _nodes(child)
    return found


async def test_the_plan_reads_two_partial_indexes_only(engine):
    """On a table whose finished rows far outnumber the waiting ones, both branches are
    index-only scans of the partial indexes, and neither table is read (heap fetches 0 once
    vacuumed: the visibility map covers every page); the switch's one row is."""
    async with engine.begin() as conn:
        # New files for both tables: the rows earlier tests deleted are not this test's subject.
        await conn.execute(text("TRUNCATE ai.context_ai_state, ai.context_embedding_backfill"))
        await conn.execute(
            text(
                "INSERT INTO ai.context_ai_state (context_id, embedding_status, keyword_status) "
                "SELECT g, 'COMPLETED', CASE WHEN g % 100 = 0 THEN 'PENDING' ELSE 'COMPLETED' END "
                "FROM generate_series(1, 20000) AS g"
            )
        )
        await conn.execute(
            text(
                "INSERT INTO ai.context_embedding_backfill (embedding_profile, context_id, status) "
                "SELECT :profile, g, CASE WHEN g % 100 = 0 THEN 'PENDING' ELSE 'COMPLETED' END "
                "FROM generate_series(1, 20000) AS g"
            ),
            {"profile": IN_USE},
        )
    async with engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.exec_driver_sql("VACUUM (ANALYZE) ai.context_ai_state")
        await conn.exec_driver_sql("VACUUM (ANALYZE) ai.context_embedding_backfill")
        await conn.exec_driver_sql("VACUUM (ANALYZE) core.embedding_switch")
        query = render(IN_USE, default_profile=IN_USE)
        (plan,) = (
            await conn.exec_driver_sql(f"EXPLAIN (ANALYZE, FORMAT JSON) {query}")
        ).scalar_one()
        count = (await conn.exec_driver_sql(query)).scalar_one()
    assert count == 400
    nodes = _nodes(plan["Plan"])
    scans = {n["Relation Name"]: n for n in nodes if "Relation Name" in n}
    state = scans["context_ai_state"]
    backfill = scans["context_embedding_backfill"]
    assert state["Node Type"] == "Index Only Scan", state
    assert state["Index Name"] == "context_ai_state_unbatched_work_idx"
    assert backfill["Node Type"] == "Index Only Scan", backfill
    assert backfill["Index Name"] == "context_embedding_backfill_unheld_idx"
    assert state["Heap Fetches"] == 0 and backfill["Heap Fetches"] == 0
    assert state["Actual Rows"] == 200 and backfill["Actual Rows"] == 200
    # Besides, only the switch's one row (CHECK id = 1) is read, once.
    assert set(scans) == {"context_ai_state", "context_embedding_backfill", "embedding_switch"}
    assert scans["embedding_switch"]["Actual Loops"] == 1


SCALER_LOGIN = "pinlog_scaler_test_login"


@pytest.fixture
async def scaler_engine(engine, migrated_database):
    async with engine.begin() as conn:
        await ensure_login_role(conn, SCALER_LOGIN, SCALER_ROLE)
    url = make_url(migrated_database).set(username=SCALER_LOGIN)
    scaler = create_async_engine(url)
    try:
        yield scaler
    finally:
        await scaler.dispose()


async def test_the_scaler_role_runs_the_query(engine, scaler_engine):
    await _seed_states(engine)
    async with scaler_engine.connect() as conn:
        work = (await conn.exec_driver_sql(render(IN_USE, default_profile=IN_USE))).scalar_one()
    assert work == 7


@pytest.mark.parametrize(
    "statement",
    [
        "SELECT context_id FROM ai.context_ai_state",
        "SELECT user_id FROM ai.context_ai_state",
        "SELECT context_id FROM ai.context_embedding_backfill",
        "SELECT embedding FROM ai.context_embedding",
        "SELECT * FROM ai.context_keyword",
        "SELECT * FROM core.context",
        "SELECT other_profile FROM core.embedding_switch",
        "UPDATE ai.context_ai_state SET keyword_status = 'PENDING'",
    ],
)
async def test_the_scaler_role_reads_nothing_else(engine, scaler_engine, statement):
    async with scaler_engine.connect() as conn:
        with pytest.raises(DBAPIError, match="permission denied"):
            await conn.exec_driver_sql(statement)


async def test_the_scaler_role_has_exactly_the_query_columns(engine):
    async with engine.connect() as conn:
        tables = (
            await conn.execute(
                text(
                    "SELECT table_schema, table_name, privilege_type "
                    "FROM information_schema.role_table_grants WHERE grantee = :role"
                ),
                {"role": SCALER_ROLE},
            )
        ).all()
        columns = (
            await conn.execute(
                text(
                    "SELECT n.nspname || '.' || c.relname, a.attname, acl.privilege_type "
                    "FROM pg_attribute AS a JOIN pg_class AS c ON c.oid = a.attrelid "
                    "JOIN pg_namespace AS n ON n.oid = c.relnamespace "
                    "CROSS JOIN LATERAL aclexplode(a.attacl) AS acl "
                    "WHERE acl.grantee = (SELECT oid FROM pg_roles WHERE rolname = :role)"
                ),
                {"role": SCALER_ROLE},
            )
        ).all()
    assert tables == []
    assert {tuple(row) for row in columns} == {
        ("ai.context_ai_state", "embedding_status", "SELECT"),
        ("ai.context_ai_state", "keyword_status", "SELECT"),
        ("ai.context_ai_state", "keyword_via_batch", "SELECT"),
        ("ai.context_embedding_backfill", "embedding_profile", "SELECT"),
        ("ai.context_embedding_backfill", "status", "SELECT"),
        ("ai.context_embedding_backfill", "batch_id", "SELECT"),
        ("core.embedding_switch", "profile_in_use", "SELECT"),
    }


def test_a_name_that_is_not_a_profile_is_never_written_into_the_query():
    with pytest.raises(ValueError, match="not a profile name"):
        render("x'; DROP TABLE ai.context_ai_state; --", default_profile=IN_USE)
    with pytest.raises(ValueError, match="not a profile name"):
        render(IN_USE, default_profile="a b")
