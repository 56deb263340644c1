"""Every CLI command of both services run as the worker's restricted role, the login role
compose creates (a member of ``pinlog_ai_worker``, privileges on ``ai`` only, §8): what it may
do works, what it may not ends with one line naming the missing privilege and an exit code,
never a traceback. Real subprocesses against the test PostgreSQL."""

from __future__ import annotations

import asyncio
import os
import shutil
import sys

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from pinlog_platform.cli import exit_codes
from pinlog_platform.contract import schema as migrations
from tests.core.harness import JWT_SECRET
from tests.e2e.processes import worker_environment
from tests.parallel_databases import ensure_login_role
from tests.worker.harness import PROFILE, SECRET

ROLE = "pinlog_ai_cli_test"


@pytest.fixture
async def worker_role_url(engine, migrated_database) -> str:
    async with engine.begin() as conn:
        await ensure_login_role(conn, ROLE, "pinlog_ai_worker")
    return make_url(migrated_database).set(username=ROLE).render_as_string(False)


async def _run(module: str, args: list[str], env: dict[str, str]) -> tuple[int, list[str]]:
    base = {k: v for k, v in os.environ.items() if not k.upper().startswith("PINLOG_")}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, *args,
        env={**base, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
    assert process.returncode is not None
    return process.returncode, (stdout.decode() + stderr.decode()).splitlines()


def _no_traceback(lines: list[str]) -> None:
    assert not any("Traceback" in line for line in lines), "\n".join(lines)


async def test_pinlog_ai_db_upgrade_as_the_worker_role_exits_0_when_nothing_is_pending(
    worker_role_url,
):
    code, lines = await _run("app.cli", ["db", "upgrade"], {"PINLOG_DATABASE_URL": worker_role_url})
    _no_traceback(lines)
    assert code == 0, lines
    assert lines[-1] == "applied 0 migration(s)"


async def test_pinlog_ai_db_upgrade_as_the_worker_role_names_the_missing_privilege(
    worker_role_url, tmp_path
):
    for bundled in migrations.runner.bundled_directory().glob("*.sql"):
        shutil.copy(bundled, tmp_path / bundled.name)
    (tmp_path / "9999_pending.sql").write_text("CREATE TABLE ai.pending_test (id int);")
    code, lines = await _run(
        "app.cli",
        ["db", "upgrade", "--migrations-dir", str(tmp_path)],
        {"PINLOG_DATABASE_URL": worker_role_url},
    )
    _no_traceback(lines)
    assert code == exit_codes.DATABASE_NOT_READY, lines
    assert len(lines) == 1 and "privilege" in lines[0], lines


async def test_pinlog_core_commands_as_the_worker_role_end_in_one_line(worker_role_url):
    env = {
        "PINLOG_CORE_DATABASE_URL": worker_role_url,
        "PINLOG_CORE_JWT_SECRET": JWT_SECRET,
        "PINLOG_CORE_WORKER_BASE_URL": "http://127.0.0.1:9",
        "PINLOG_CORE_INTERNAL_SECRET": SECRET,
        "PINLOG_CORE_EMBEDDING_PROFILE": PROFILE,
    }
    # Nothing pending: no DDL, nothing it may not do.
    code, lines = await _run("core_service.cli", ["db", "upgrade"], env)
    _no_traceback(lines)
    assert (code, lines) == (0, ["applied 0 migration(s)"])
    code, lines = await _run("core_service.cli", ["token", "--member", "1"], env)
    _no_traceback(lines)
    assert code == exit_codes.DATABASE_NOT_READY, lines
    assert len(lines) == 1 and "lacks privileges on schema core" in lines[0], lines
    # The pass reads the core's pause state first (core.*): refused in one line, like token.
    code, lines = await _run("core_service.cli", ["rescan", "--once"], env)
    _no_traceback(lines)
    assert code == exit_codes.DATABASE_NOT_READY, lines
    assert len(lines) == 1 and "lacks privileges on schema core" in lines[0], lines


async def test_serve_and_doctor_as_the_worker_role(worker_role_url, fake_openai_server):
    # pinlog-core serve checks its schema first: the worker's role may not use core.
    env = {
        "PINLOG_CORE_DATABASE_URL": worker_role_url,
        "PINLOG_CORE_JWT_SECRET": JWT_SECRET,
        "PINLOG_CORE_WORKER_BASE_URL": "http://127.0.0.1:9",
        "PINLOG_CORE_INTERNAL_SECRET": SECRET,
        "PINLOG_CORE_EMBEDDING_PROFILE": PROFILE,
    }
    code, lines = await _run("core_service.cli", ["serve", "--port", "9"], env)
    _no_traceback(lines)
    assert code == exit_codes.DATABASE_NOT_READY, lines
    assert len(lines) == 1 and "lacks privileges on schema core" in lines[0], lines
    # pinlog-ai doctor reads the ai schema only.
    worker_env = {"PINLOG_DATABASE_URL": worker_role_url, "PINLOG_OFFLINE": "true"}
    code, lines = await _run("app.cli", ["doctor"], worker_env)
    _no_traceback(lines)
    assert code == 0 and lines[-1] == "doctor: 0 violation(s)", lines
    # pinlog-ai presets load writes ai.keyword_preset, which the role may (compose runs it so).
    code, lines = await _run("app.cli", ["presets", "load"], worker_env)
    _no_traceback(lines)
    assert code == 0 and any(line.startswith("presets updated") for line in lines), lines


async def test_presets_load_writes_what_its_embeddings_cost_to_the_ledger(
    engine, migrated_database, fake_openai
):
    """``presets load`` pays for its embedding calls: one ledger row under stage
    ``presets`` whose calls and tokens equal the ``usage`` the provider sent."""
    code, lines = await _run(
        "app.cli", ["presets", "load"], worker_environment(migrated_database, fake_openai)
    )
    _no_traceback(lines)
    assert code == 0, lines
    sent = fake_openai.usage_sent["embeddings"]
    assert sent
    async with engine.connect() as conn:
        rows = (
            await conn.execute(
                text(
                    "SELECT provider, stage, calls, embedding_tokens, estimated_tokens "
                    "FROM ai.provider_usage_daily"
                )
            )
        ).all()
    assert [tuple(row) for row in rows] == [
        ("embedding", "presets", len(sent), sum(u["prompt_tokens"] for u in sent), 0)
    ]
