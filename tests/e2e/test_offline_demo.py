"""The ``make run`` path on the test database: offline providers, real HTTP, real state machine."""

from __future__ import annotations

import asyncio
import os
import re
import sys

from sqlalchemy import text

from demo.feed import load_changes, load_samples
from demo.report import NOTE_WIDTH, render_results
from demo.run import both_services, feed_and_report, offline_settings, prepare_database
from demo.table import display_width, shorten
from pinlog_platform import schema as migrations

JWT_SECRET = "demo-test-jwt-secret-0123456789abcdef"


async def test_samples_flow_through_the_core_service_and_the_worker_offline(
    engine, migrated_database
):
    settings = offline_settings(migrated_database)
    said: list[str] = []
    await prepare_database(settings, say=said.append)
    samples, changes = load_samples(), load_changes()

    async with both_services(settings, jwt_secret=JWT_SECRET) as services:
        outcome, results, views = await feed_and_report(services, say=said.append)
    table = render_results(results)

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
    # One line per step, the worker's progress as "n/total processed", ending at the total.
    assert said[0].startswith("migrations: ")
    assert said[1].startswith("presets: loading")
    assert re.fullmatch(
        r"presets: \d+ (embedded and stored|already stored) \(list version \d+\)", said[2]
    )
    assert said[3].startswith(f"notes sent: {len(samples)} created by ")
    progress = [line for line in said[4:] if line.startswith("worker: ")]
    assert progress and progress[-1] == f"worker: {len(live)}/{len(live)} processed"
    assert all(re.fullmatch(r"worker: \d+/\d+ processed", line) for line in progress)
    # The table shows each note's text (shortened) next to its keywords.
    header = table.splitlines()[0].split()
    assert header.index("note") < header.index("keywords")
    assert shorten(samples[0].text, NOTE_WIDTH) in table
    assert all(display_width(shorten(s.text, NOTE_WIDTH)) <= NOTE_WIDTH for s in samples)


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
