"""The ``make run`` path on the test database: offline providers, real HTTP, real state machine."""

from __future__ import annotations

import asyncio
import os
import sys

from sqlalchemy import text

import pinlog_schema
from demo.run import feed_and_report, load_samples, offline_settings, prepare_database
from tests.harness import running_worker


async def test_every_sample_context_completes_both_stages_offline(engine, migrated_database):
    settings = offline_settings(migrated_database)
    await prepare_database(settings)
    samples = load_samples()

    async with running_worker(settings) as worker:
        results = await feed_and_report(settings, str(worker.client.base_url), samples)

    assert len(results) == len(samples) >= 60
    assert {(r.embedding_status, r.keyword_status) for r in results} == {("COMPLETED", "COMPLETED")}
    with_keywords = sum(bool(r.keywords) for r in results)
    assert with_keywords >= len(samples) // 2, with_keywords
    async with engine.connect() as conn:
        blocked_used = (
            await conn.execute(
                text(
                    "SELECT count(*) FROM ai.context_keyword k JOIN ai.keyword_preset p "
                    "ON p.id = k.keyword_id WHERE p.visibility = 'BLOCKED' OR NOT p.is_active"
                )
            )
        ).scalar_one()
    assert blocked_used == 0


async def test_cli_db_upgrade_twice_applies_then_nothing(empty_database):
    env = {**os.environ, "PINLOG_DATABASE_URL": empty_database}
    command = [sys.executable, "-m", "app.cli", "db", "upgrade"]

    first_code, first_out = await _run(command, env)
    second_code, second_out = await _run(command, env)

    ai_files = pinlog_schema.discover(scope=pinlog_schema.Scope.AI)
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
