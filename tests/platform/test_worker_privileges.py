"""The worker's role has exactly the declared privileges
(``pinlog_platform/contract/schema/worker_privileges.py``), and is refused on the columns it must
not
write, over SQL as that role."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from pinlog_platform.contract.schema.worker_privileges import (
    COLUMN_INSERTS,
    COLUMN_UPDATES,
    TABLE_PRIVILEGES,
    WORKER_ROLE,
)
from tests.parallel_databases import ensure_login_role
from tests.worker.harness import running_worker, worker_settings
from tests.worker.support import fetch_state, make_embedding, make_state

TABLE_GRANTS = text(
    """
    SELECT table_schema, table_name, privilege_type FROM information_schema.role_table_grants
    WHERE grantee = :role
    """
)
# Column-level grants only (information_schema.column_privileges also lists table-level ones).
COLUMN_GRANTS = text(
    """
    SELECT n.nspname, c.relname, a.attname, acl.privilege_type
    FROM pg_attribute AS a
    JOIN pg_class AS c ON c.oid = a.attrelid
    JOIN pg_namespace AS n ON n.oid = c.relnamespace
    CROSS JOIN LATERAL aclexplode(a.attacl) AS acl
    WHERE acl.grantee = (SELECT oid FROM pg_roles WHERE rolname = :role)
    """
)


async def test_the_worker_role_has_exactly_the_declared_privileges(engine):
    async with engine.connect() as conn:
        tables = (await conn.execute(TABLE_GRANTS, {"role": WORKER_ROLE})).all()
        columns = (await conn.execute(COLUMN_GRANTS, {"role": WORKER_ROLE})).all()

    granted: dict[str, set[str]] = {}
    for schema, table, privilege in tables:
        assert schema == "ai", (schema, table)
        granted.setdefault(table, set()).add(privilege)
    assert granted == {table: set(privileges) for table, privileges in TABLE_PRIVILEGES.items()}

    by_privilege: dict[str, dict[str, set[str]]] = {"UPDATE": {}, "INSERT": {}}
    for schema, table, column, privilege in columns:
        assert schema == "ai" and privilege in by_privilege, (schema, table, column, privilege)
        by_privilege[privilege].setdefault(table, set()).add(column)
    assert by_privilege["UPDATE"] == {table: set(cols) for table, cols in COLUMN_UPDATES.items()}
    assert by_privilege["INSERT"] == {table: set(cols) for table, cols in COLUMN_INSERTS.items()}


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE ai.context_ai_state SET user_id = 2",
        "UPDATE ai.context_ai_state SET record_id = 2",
        "UPDATE ai.context_ai_state SET retry_count = 0",
        "UPDATE ai.context_ai_state SET rescanned_at = now()",
        "UPDATE ai.context_ai_state SET text_sha256_from_core = false",
        "UPDATE ai.context_embedding SET is_deleted = false",
        "UPDATE ai.context_ai_state SET keyword_reprocess_version = 1",
        "UPDATE ai.keyword_preset SET embedding_profile = 'x'",
        "UPDATE ai.keyword_preset SET code = 'RENAMED'",
        "INSERT INTO ai.keyword_preset (id, code, display_name, category, description, examples, "
        "embedding_profile) VALUES (99, 'X', 'x', 'ACTIVITY', 'x', '{a}', 'p')",
        "DELETE FROM ai.keyword_preset_embedding",
        "SELECT count(*) FROM core.context",
    ],
)
async def test_the_worker_role_is_refused_on_columns_it_must_not_write(engine, statement):
    await make_state(engine, context_id=1, user_id=1, record_id=1)
    await make_embedding(engine, context_id=1)
    async with engine.connect() as conn:
        await conn.execute(text(f"SET ROLE {WORKER_ROLE}"))
        with pytest.raises(DBAPIError, match="permission denied"):
            await conn.execute(text(statement))
        await conn.rollback()


async def test_the_worker_role_may_write_its_own_columns(engine):
    await make_state(engine, context_id=1, user_id=1, record_id=1)
    await make_embedding(engine, context_id=1)
    async with engine.connect() as conn:
        await conn.execute(text(f"SET ROLE {WORKER_ROLE}"))
        await conn.execute(
            text(
                "UPDATE ai.context_ai_state SET embedding_status = 'PROCESSING', "
                "embedding_attempt = embedding_attempt + 1, updated_at = now(), "
                "seen_user_id = 1, seen_record_id = 1, text_sha256 = text_sha256"
            )
        )
        await conn.execute(
            text("UPDATE ai.context_embedding SET user_id = 1, record_id = 1, updated_at = now()")
        )
        await conn.rollback()


async def test_a_worker_logged_in_as_a_member_of_the_role_completes_a_context(
    engine, migrated_database, fake_openai, presets
):
    """The column grants cover everything the pipeline writes: start, both saves, presets."""
    async with engine.begin() as conn:
        await ensure_login_role(conn, "pinlog_ai_test_login", WORKER_ROLE)
    url = make_url(migrated_database).set(username="pinlog_ai_test_login")
    await make_state(engine, context_id=1, user_id=7, record_id=70, core_text="조용한 카페")
    settings = worker_settings(url.render_as_string(hide_password=False), fake_openai)
    async with running_worker(settings) as worker:
        body = {"contextId": 1, "userId": 7, "recordId": 70, "text": "조용한 카페", "placeMeta": {}}
        assert (await worker.post(body)).status_code == 202
        await worker.drain()
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
