"""The ``make run`` path on the test database: offline providers, real HTTP, real state machine;
and ``make run-operations`` (``--operations``) as a process on a fresh database."""

from __future__ import annotations

import asyncio
import os
import re
import sys

import pytest
from sqlalchemy import text

from app.repository.db import create_engine
from app.settings import OFFLINE_PROFILE, USE_PROFILE
from demo.feed import load_changes, load_samples
from demo.report import NOTE_WIDTH, render_results
from demo.run import both_services, feed_and_report, offline_settings, prepare_database
from demo.table import display_width, shorten
from pinlog_platform.contract import schema as migrations

JWT_SECRET = "demo-test-jwt-secret-0123456789abcdef"
OPERATIONS_SECONDS = 110.0  # about 40 s on 2 cores
SWITCH = text("SELECT profile_in_use, state FROM core.embedding_switch")
# Every profile a note vector, a preset vector or a live note's judgment is stored under.
PROFILES_STORED = text(
    "SELECT embedding_profile FROM ai.context_embedding "
    "UNION SELECT embedding_profile FROM ai.keyword_preset_embedding "
    "UNION SELECT a.embedding_profile FROM ai.context_keyword_analysis AS a "
    "JOIN ai.context_ai_state AS s USING (context_id) WHERE s.keyword_status = 'COMPLETED'"
)


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


# Its worker's preset refresh must never find the list missing mid-switch; timing that the
# parallel pass's load has broken: alone, in the serial pass.
@pytest.mark.serial
async def test_operations_reclassify_the_presets_then_switch_the_profile(empty_database):
    """``pinlog-ai demo --operations --no-serve`` on a fresh database: after the table, a
    preset reclassification under the profile in use, then a switch to the hashing profile,
    one line per step and no log line; the database ends on the new profile alone."""
    env = {**os.environ, "PINLOG_DATABASE_URL": empty_database}
    command = [sys.executable, "-m", "app.cli", "demo", "--operations", "--no-serve",
               "--port", "0", "--core-port", "0"]  # fmt: skip

    code, output = await _run(command, env, limit_seconds=OPERATIONS_SECONDS)

    assert code == 0, output
    lines = output.splitlines()
    assert not [line for line in lines if re.search(r" (WARNING|ERROR) |Traceback", line)]

    def one(pattern: str) -> re.Match:
        found = [m for m in map(re.compile(pattern).fullmatch, lines) if m]
        assert len(found) == 1, (pattern, output)
        return found[0]

    one(rf"presets: 28 embedded and stored under {OFFLINE_PROFILE} too, for the second worker")
    one(r"services: workers on http://\S+ and http://\S+, core service on http://\S+")
    table = one(r"\d+ contexts: (\d+) live \((\d+) COMPLETED in both .*")
    live = int(table[1])
    assert table[2] == table[1]
    for profile in (USE_PROFILE, OFFLINE_PROFILE):  # the new list under both profiles
        one(rf"reclassify: presets load under {profile}: list version 2, 30 presets")
    one(
        rf"reclassify: reprocess keywords --rate 50: the worker reported list version 2 after "
        rf"[\d.]+ s \(its background refresh\); {live} notes reset and judged again in .*"
    )
    changed = int(one(rf"reclassify: (\d+) of {live} notes show other keywords.*")[1])
    examples = [line.split(" -> ")[1] for line in lines if line.startswith("  context ")]
    assert changed >= 1 and any("웨이팅" in e or "힐링" in e for e in examples), output
    one(r"switch: presets load under the new profile: already stored \(list version 2\)")
    one(rf"switch: reembed status: ready, {live}/{live} embedded")
    one(
        r"switch: search .*: [1-5] results?, best context \d+ .*, from the worker of the old "
        r"profile"
    )
    one(r"switch: the second profile is a TEST encoder \(.*F1 0\.48.*\).*worse keywords.*")
    rejudged = one(
        rf"switch: keywords judged again under the new profile: {live} notes in .*; "
        rf"(\d+) of {live} show other keywords.*"
    )
    after_switch = lines[lines.index(rejudged[0]) + 1 :]
    shown = [line for line in after_switch if line.startswith("  context ")]
    assert len(shown) == min(3, int(rejudged[1])), output
    assert all(re.fullmatch(r"  context \d+ \(.*\): \[.*\] -> \[.*\]", s) for s in shown)
    one(r"switch: the same search: [1-5] results?, .*, from the worker of the new profile")
    one(rf"switch: {live} notes embedded under the new profile in [1-9]\d* provider call\(s\).*")

    engine = create_engine(empty_database, pool_size=1)
    try:
        async with engine.connect() as conn:
            switch = (await conn.execute(SWITCH)).one()
            profiles = set((await conn.execute(PROFILES_STORED)).scalars())
    finally:
        await engine.dispose()
    assert tuple(switch) == (OFFLINE_PROFILE, "idle")
    assert profiles == {OFFLINE_PROFILE}


async def _run(
    command: list[str], env: dict[str, str], *, limit_seconds: float = 60
) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *command, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    output, _ = await asyncio.wait_for(process.communicate(), timeout=limit_seconds)
    return process.returncode, output.decode()
