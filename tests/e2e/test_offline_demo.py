"""The ``make run`` path on the test database: offline providers, real HTTP, real state machine."""

from __future__ import annotations

import asyncio
import os
import sys

from sqlalchemy import text

from demo.feed import load_changes, load_samples
from demo.run import both_services, feed_and_report, offline_settings, prepare_database
from pinlog_platform import schema as migrations

JWT_SECRET = "demo-test-jwt-secret-0123456789abcdef"


async def test_samples_flow_through_the_core_service_and_the_worker_offline(
    engine, migrated_database
):
    settings = offline_settings(migrated_database)
    await prepare_database(settings)
    samples, changes = load_samples(), load_changes()

    async with both_services(settings, jwt_secret=JWT_SECRET) as services:
        outcome, results, views = await feed_and_report(services)

    live = [r for r in results if r.fate == "live"]
    gone = [r for r in results if r.fate != "live"]
    assert len(results) == len(samples) + len(changes.edits) >= 60
    assert {(r.embedding_status, r.keyword_status) for r in live} == {("COMPLETED", "COMPLETED")}
    assert {(r.embedding_status, r.keyword_status) for r in gone} == {("CANCELLED", "CANCELLED")}
    fates = sorted(r.fate.split(" ")[0] for r in gone)
    assert fates == ["deleted", "record", "replaced", "replaced"], fates
    assert sum(bool(r.keywords) for r in live) >= len(live) // 2
    assert any("whitespace-only edit" in event and "no-op" in event for event in outcome.events)
    assert any(": 409 " in event for event in outcome.events)  # the last-context guard
    assert len(views) == len(changes.views)
    async with engine.connect() as conn:
        blocked_used = (
            await conn.execute(
                text(
                    "SELECT count(*) FROM ai.context_keyword k JOIN ai.keyword_preset p "
                    "ON p.id = k.keyword_id WHERE p.visibility = 'BLOCKED' OR NOT p.is_active"
                )
            )
        ).scalar_one()
        active_contexts = (
            await conn.execute(text("SELECT count(*) FROM core.context WHERE deleted_at IS NULL"))
        ).scalar_one()
    assert blocked_used == 0
    assert active_contexts == len(live)


async def test_cli_db_upgrade_twice_applies_then_nothing(empty_database):
    env = {**os.environ, "PINLOG_DATABASE_URL": empty_database}
    command = [sys.executable, "-m", "app.cli", "db", "upgrade"]

    first_code, first_out = await _run(command, env)
    second_code, second_out = await _run(command, env)

    ai_files = migrations.discover(scope=migrations.Scope.AI)
    assert first_code == 0, first_out
    assert f"applied {len(ai_files)} migration(s)" in first_out
    assert not any(file.is_core for file in ai_files)
    assert second_code == 0, second_out
    assert second_out.strip() == "applied 0 migration(s)"


async def _run(command: list[str], env: dict[str, str]) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *command, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    output, _ = await asyncio.wait_for(process.communicate(), timeout=60)
    return process.returncode, output.decode()
