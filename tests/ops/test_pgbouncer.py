"""Both services through a real PgBouncer in transaction pooling mode (docs/deployment.md).

Without ``*_DATABASE_TRANSACTION_POOLING`` the connection is refused (startup parameters);
with it, the core service creates 30 records, the worker completes every stage through the
pooler (prepared statements shared by clients of 4 server connections), search answers 200,
and the timeouts hold inside transactions via ``SET LOCAL``.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from app.repository.db import autocommit as worker_autocommit
from app.repository.db import create_engine as create_worker_engine
from core_service.repository.db import autocommit as core_autocommit
from core_service.repository.db import create_engine as create_core_engine
from tests.core.harness import bearer, core_settings, make_member, running_core
from tests.ops.pgbouncer import find_binary, running_pgbouncer
from tests.worker.harness import running_worker, worker_settings

BINARY = find_binary()
pytestmark = pytest.mark.skipif(
    BINARY is None,
    reason="pgbouncer is not installed (.ci/run installs it: apt-get install -y pgbouncer)",
)
CONTEXTS = 30
COUNT_COMPLETED = text(
    "SELECT count(*) FROM ai.context_ai_state "
    "WHERE embedding_status = 'COMPLETED' AND keyword_status = 'COMPLETED'"
)


@pytest.fixture(scope="module")
def bouncer_url(migrated_database):
    assert BINARY is not None
    # Not under pytest's temp root: that is private to root (0700), and PgBouncer runs as an
    # unprivileged user that must reach its work directory.
    workdir = Path(tempfile.mkdtemp(prefix="pinlog-pgbouncer-"))
    workdir.chmod(0o755)
    try:
        with running_pgbouncer(BINARY, migrated_database, workdir / "pgb") as url:
            yield url
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


async def test_startup_parameters_are_refused_without_the_setting(bouncer_url) -> None:
    engine = create_worker_engine(bouncer_url, with_vector_codec=False)
    try:
        with pytest.raises(Exception, match="unsupported startup parameter"):
            async with engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
    finally:
        await engine.dispose()


async def test_timeouts_are_set_per_transaction_and_in_the_autocommit_helpers(
    bouncer_url,
) -> None:
    cases = (
        (create_worker_engine, worker_autocommit, "3s"),
        (create_core_engine, core_autocommit, "5s"),
    )
    for factory, helper, expected in cases:
        engine = factory(bouncer_url, transaction_pooling=True)
        try:
            for block in (engine.begin, lambda engine=engine, helper=helper: helper(engine)):
                async with block() as conn:
                    assert (await conn.execute(text("SHOW lock_timeout"))).scalar() == expected
                    idle = await conn.execute(text("SHOW idle_in_transaction_session_timeout"))
                    assert idle.scalar() == "1min"
        finally:
            await engine.dispose()


async def test_both_services_work_through_transaction_pooling(
    engine, bouncer_url, fake_openai, presets
) -> None:
    members = (1, 2, 3)
    for member_id in members:
        await make_member(engine, member_id)
    settings = worker_settings(bouncer_url, fake_openai, database_transaction_pooling=True)
    async with running_worker(settings) as worker:
        core_config = core_settings(
            bouncer_url, str(worker.client.base_url), database_transaction_pooling=True
        )
        async with running_core(core_config) as core:
            for number in range(CONTEXTS):
                response = await core.create(
                    members[number % 3], f"조용한 카페 노트 {number}", place=f"place-{number}"
                )
                assert response.status_code == 201, response.text
            deadline = time.monotonic() + 90
            while await _completed(engine) < CONTEXTS:
                assert time.monotonic() < deadline, await _unfinished(engine)
                await asyncio.sleep(0.1)
            found = await core.client.post(
                "/api/v1/search", json={"query": "조용한 카페", "limit": 5}, headers=bearer(1)
            )
            assert found.status_code == 200, found.text
            assert found.json()["results"]
        ready = await worker.client.get("/readyz")
        assert ready.status_code == 200


async def _unfinished(engine) -> list[tuple]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT context_id, embedding_status, keyword_status, retry_count "
                "FROM ai.context_ai_state WHERE keyword_status <> 'COMPLETED'"
            )
        )
        return [tuple(row) for row in rows]


async def _completed(engine) -> int:
    async with engine.connect() as conn:
        return (await conn.execute(COUNT_COMPLETED)).scalar_one()
