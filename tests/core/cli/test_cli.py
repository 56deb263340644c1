"""``pinlog-core`` as a real command: migrations of both services in either order, tokens,
one rescan pass, and one-line errors with distinct exit codes (no traceback)."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import jwt
from sqlalchemy import text

from app.repository.db import create_engine
from core_service.repository.db import autocommit as autocommit_core
from core_service.service.member_tokens import AUDIENCE
from pinlog_platform.contract import schema as migrations
from tests.core.harness import JWT_SECRET, profile_workers
from tests.core.support import (
    TARGET,
    assert_status_of_mix,
    build_status_mix,
    judged,
    per_1000_line,
    spend_line,
    switch_start,
)
from tests.worker.harness import PROFILE, SECRET
from tests.worker.support import make_state

CORE = [sys.executable, "-m", "core_service.cli"]
WORKER = [sys.executable, "-m", "app.cli"]

# Everything that makes up the ai schema: columns, constraints, indexes.
AI_SCHEMA_FACTS = text(
    """
    SELECT 'column' AS kind, table_name || '.' || column_name || ' ' || data_type || ' '
           || is_nullable || ' ' || coalesce(column_default, '') AS fact
    FROM information_schema.columns WHERE table_schema = 'ai'
    UNION ALL
    SELECT 'constraint', conrelid::regclass::text || ' ' || pg_get_constraintdef(oid)
    FROM pg_constraint WHERE connamespace = 'ai'::regnamespace
    UNION ALL
    SELECT 'index', indexdef FROM pg_indexes WHERE schemaname = 'ai'
    ORDER BY 1, 2
    """
)


def _environment(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PINLOG_")}
    env.update(values)
    return env


async def _run(command: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *command, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    return process.returncode, out.decode(), err.decode()


async def _ai_schema(url: str) -> list[tuple[str, str]]:
    engine = create_engine(url, with_vector_codec=False)
    try:
        async with engine.connect() as conn:
            return [tuple(row) for row in await conn.execute(AI_SCHEMA_FACTS)]
    finally:
        await engine.dispose()


async def test_either_order_of_the_two_upgrades_leaves_the_same_ai_schema(make_empty_database):
    ai_first, core_first = await make_empty_database(), await make_empty_database()

    steps = [
        (WORKER, ai_first, "PINLOG_DATABASE_URL"),
        (CORE, ai_first, "PINLOG_CORE_DATABASE_URL"),
        (CORE, core_first, "PINLOG_CORE_DATABASE_URL"),
        (WORKER, core_first, "PINLOG_DATABASE_URL"),
    ]
    outputs = []
    for command, url, variable in steps:
        code, out, err = await _run([*command, "db", "upgrade"], _environment(**{variable: url}))
        assert code == 0, err
        outputs.append(out.strip())

    every_file = migrations.discover()
    ai_files = migrations.discover(scope=migrations.Scope.AI)
    core_only = len(every_file) - len(ai_files)
    assert outputs[0].startswith(f"applied {len(ai_files)} migration(s)")
    assert outputs[1].startswith(f"applied {core_only} migration(s)")
    assert outputs[2].startswith(f"applied {len(every_file)} migration(s)")
    assert outputs[3] == "applied 0 migration(s)"
    assert await _ai_schema(ai_first) == await _ai_schema(core_first)
    assert await _ai_schema(ai_first)  # the comparison saw a real schema


async def test_core_upgrade_twice_applies_everything_then_nothing(empty_database):
    env = _environment(PINLOG_CORE_DATABASE_URL=empty_database)
    first = await _run([*CORE, "db", "upgrade"], env)
    second = await _run([*CORE, "db", "upgrade"], env)
    assert first[0] == 0 and second[0] == 0
    assert second[1].strip() == "applied 0 migration(s)"


async def test_token_creates_the_member_and_prints_only_the_token(engine, migrated_database):
    env = _environment(
        PINLOG_CORE_DATABASE_URL=migrated_database, PINLOG_CORE_JWT_SECRET=JWT_SECRET
    )

    code, out, err = await _run([*CORE, "token", "--member", "42"], env)

    assert code == 0, err
    assert out.count("\n") == 1
    claims = jwt.decode(out.strip(), JWT_SECRET, algorithms=["HS256"], audience=AUDIENCE)
    assert claims["sub"] == "42" and claims["exp"] > claims["iat"]
    async with engine.connect() as conn:
        exists = (
            await conn.execute(text("SELECT count(*) FROM core.member WHERE id = 42"))
        ).scalar()
    assert exists == 1


async def test_rescan_once_prints_its_counts(engine, migrated_database):
    """Its own counts, and what this pass finalized by reason code; started with only the
    settings it uses (no signing key of member tokens)."""
    await make_state(engine, context_id=1, retry_count=3, updated_seconds_ago=10_000)
    env = _environment(
        PINLOG_CORE_DATABASE_URL=migrated_database,
        PINLOG_CORE_WORKER_BASE_URL="http://127.0.0.1:9",
        PINLOG_CORE_INTERNAL_SECRET=SECRET,
        PINLOG_CORE_EMBEDDING_PROFILE=PROFILE,
    )

    code, out, err = await _run([*CORE, "rescan", "--once"], env)

    assert code == 0, err
    assert out.startswith("closed 0 blocked keyword stage(s), finalized 1, claimed 0")
    assert out.splitlines()[1] == "finalized by reason: retries_exhausted=1 embedding_failed=0"
    assert out.splitlines()[2] == "backfill: nothing sent"  # no switch under way


async def test_rescan_once_runs_one_backfill_pass(engine, migrated_database, core_with_fake_worker):
    """Issue 28 #3: a deployment without the rescan loop runs ``rescan --once`` from a
    scheduler; each run also sends the profile switch's next backfill batch (seeding first
    when nothing is open) to a worker of the target profile, over HTTP."""
    ids = sorted(
        [await judged(core_with_fake_worker, engine, f"메모 {n}", place=f"p{n}") for n in range(2)]
    )
    async with autocommit_core(engine) as conn:
        assert await switch_start(conn, in_use=PROFILE, target=TARGET, rate=50)
    async with profile_workers(TARGET) as (worker,):
        env = _environment(
            PINLOG_CORE_DATABASE_URL=migrated_database,
            PINLOG_CORE_WORKER_BASE_URL=worker.base_url,
            PINLOG_CORE_INTERNAL_SECRET=SECRET,
            PINLOG_CORE_EMBEDDING_PROFILE=PROFILE,
        )

        code, out, err = await _run([*CORE, "rescan", "--once"], env)

    assert code == 0, err
    assert worker.batched_context_ids() == [ids]
    assert out.splitlines()[2] == "backfill: completed=2"


async def test_configuration_and_database_problems_are_one_line_with_distinct_exit_codes():
    missing = await _run([*CORE, "rescan", "--once"], _environment())
    unreachable = await _run(
        [*CORE, "db", "upgrade"],
        _environment(PINLOG_CORE_DATABASE_URL="postgresql+asyncpg://u@127.0.0.1:9/db"),
    )

    assert missing[0] == 2
    assert "Traceback" not in missing[2]
    assert all(
        line.startswith("pinlog-core: configuration error: PINLOG_CORE_")
        for line in missing[2].splitlines()
    )
    assert len(missing[2].splitlines()) == 4  # every required setting named at once
    assert unreachable[0] == 3
    assert unreachable[2].strip().startswith("pinlog-core: database error:")
    assert "Traceback" not in unreachable[2]


async def test_status_json_has_exactly_the_documented_keys_and_counts(engine, migrated_database):
    """Both forms, the spend of today and this month included."""
    expected = await build_status_mix(engine)
    env = _environment(PINLOG_CORE_DATABASE_URL=migrated_database)

    code, out, err = await _run([*CORE, "status", "--json"], env)
    text_code, text_out, _ = await _run([*CORE, "status"], env)

    assert code == 0, err
    status = json.loads(out)
    # The mix's contexts are written without search terms (as before migration 0080).
    live = sum(expected["stages"]["embedding"].values())
    assert status.pop("search_index") == {"indexed": 0, "total": live}
    assert status.pop("batches") == {
        "submitted": 0, "in_progress": 0, "completed": 0, "failed": 0, "items": 0,
    }  # fmt: skip
    assert_status_of_mix(status, expected)
    assert text_code == 0 and "PAUSED" in text_out and "backlog:       3" in text_out
    assert f"search index:  0 of {live} live contexts indexed" in text_out
    assert spend_line(expected) in text_out.splitlines()
    assert per_1000_line(expected) in text_out.splitlines()


async def test_pause_and_resume_print_the_state_and_are_idempotent(engine, migrated_database):
    env = _environment(PINLOG_CORE_DATABASE_URL=migrated_database)
    outputs = []
    for command in ("pause", "pause", "resume"):
        code, out, err = await _run([*CORE, command], env)
        assert code == 0, err
        outputs.append(out.strip())

    assert outputs == ["dispatch paused", "dispatch paused", "dispatch running"]


def _serve_env(database_url: str) -> dict[str, str]:
    return _environment(
        PINLOG_CORE_DATABASE_URL=database_url,
        PINLOG_CORE_JWT_SECRET=JWT_SECRET,
        PINLOG_CORE_WORKER_BASE_URL="http://127.0.0.1:9",
        PINLOG_CORE_INTERNAL_SECRET=SECRET,
        PINLOG_CORE_EMBEDDING_PROFILE=PROFILE,
    )


async def test_serve_checks_the_database_first_exit_3_unreachable_4_without_schema(
    empty_database,
):
    unreachable = "postgresql+asyncpg://nobody:pw-do-not-print@127.0.0.1:9/pinlog"
    code, _, err = await _run([*CORE, "serve", "--port", "9"], _serve_env(unreachable))
    lines = err.splitlines()
    assert code == 3, err
    assert len(lines) == 1 and lines[0].startswith("pinlog-core: database error")
    assert "pw-do-not-print" not in err

    code, _, err = await _run([*CORE, "serve", "--port", "9"], _serve_env(empty_database))
    assert code == 4, err
    assert err.splitlines() == [
        "pinlog-core: database error: the schema is missing: run `pinlog-core db upgrade`"
    ]


async def test_reindex_search_indexes_what_is_missing_and_status_counts_it(
    engine, migrated_database
):
    """``pinlog-core reindex search`` over contexts written without terms: all indexed, then
    a second run has nothing to do; ``status --json`` counts them."""
    expected = await build_status_mix(engine)
    live = sum(expected["stages"]["embedding"].values())
    env = _environment(PINLOG_CORE_DATABASE_URL=migrated_database)

    code, out, err = await _run([*CORE, "reindex", "search", "--rate", "1000"], env)
    again_code, again, _ = await _run([*CORE, "reindex", "search"], env)
    status_code, status, _ = await _run([*CORE, "status", "--json"], env)

    assert code == 0, err
    assert out.splitlines()[-1].endswith(f"{live} of {live} live context(s) indexed")
    assert again_code == 0 and again.startswith("indexed 0 context(s) in ")
    assert status_code == 0
    assert json.loads(status)["search_index"] == {"indexed": live, "total": live}
