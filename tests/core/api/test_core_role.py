"""The core service runs as its own role, not the owner (0023): a login role
that is only a member of ``pinlog_core_service`` serves the whole lifecycle over HTTP, reads the
status with the provider spend (0041), and is refused where §0 gives the core nothing."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from core_service.repository import status_counts
from core_service.service.status import StatusReport
from tests.core.harness import bearer, core_settings, running_core
from tests.core.support import build_status_mix
from tests.parallel_databases import ensure_login_role

LOGIN = "pinlog_core_test_login"


@pytest.fixture
async def core_role_url(engine, migrated_database) -> str:
    async with engine.begin() as conn:
        await ensure_login_role(conn, LOGIN, "pinlog_core_service")
    return make_url(migrated_database).set(username=LOGIN).render_as_string(hide_password=False)


async def test_the_core_role_serves_create_read_edit_and_delete(
    core_role_url, members, fake_worker
):
    async with running_core(core_settings(core_role_url, fake_worker.base_url)) as core:
        created = await core.create(1, "첫 메모")
        assert created.status_code == 201, created.text
        record_id, context_id = created.json()["recordId"], created.json()["contextId"]
        client = core.client
        added = await client.post(
            f"/api/v1/records/{record_id}/contexts", json={"body": "둘"}, headers=bearer(1)
        )
        assert added.status_code == 201
        edited = await client.put(
            f"/api/v1/contexts/{context_id}", json={"body": "고친 메모"}, headers=bearer(1)
        )
        assert edited.status_code == 200
        read = await client.get(f"/api/v1/records/{record_id}", headers=bearer(1))
        assert read.status_code == 200
        deleted = await client.delete(f"/api/v1/records/{record_id}", headers=bearer(1))
        assert deleted.status_code == 204
        assert (await core.scheduler().run_once()) is not None


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE ai.context_embedding SET embedding_profile = 'x'",
        "DELETE FROM core.context",
        "INSERT INTO ai.context_keyword (context_id, keyword_id, preset_version) VALUES (1, 1, 1)",
        "CREATE TABLE core.intruder (id int)",
        "UPDATE ai.provider_usage_daily SET calls = 0",
    ],
)
async def test_the_core_role_is_refused_outside_its_share(engine, statement):
    async with engine.connect() as conn:
        await conn.execute(text("SET ROLE pinlog_core_service"))
        with pytest.raises(DBAPIError, match="permission denied"):
            await conn.execute(text(statement))
        await conn.rollback()


async def test_the_core_role_reads_the_status_with_the_spend(engine):
    """The one status statement, the workers' usage ledger included, as the core's role."""
    expected = await build_status_mix(engine)
    async with engine.connect() as conn:
        await conn.execute(text("SET ROLE pinlog_core_service"))
        counts = await status_counts.read(conn, processing_expiry_seconds=600)
        await conn.rollback()

    assert StatusReport.from_counts(counts).spend == expected["spend"]
