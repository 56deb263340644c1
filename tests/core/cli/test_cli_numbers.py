"""Every option of both CLIs that takes an id, a count, a port or a duration refuses what is not
one, within its range, as a usage error (exit 2 naming the option) before any database or
provider is contacted: ``pinlog_platform/cli/numbers.py``."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest
from typer.testing import CliRunner

from app.cli import app as worker_cli
from core_service.cli import app as core_cli
from tests.core.harness import JWT_SECRET

CORE = [sys.executable, "-m", "core_service.cli"]
BIGINT_OVER = str(2**63)
NOT_CANONICAL = ["1_0", " 1", "1 ", "+1", "01", "1.0", "\u0661", "0x1"]

# (CLI, arguments before the value, option, value): each must be refused.
REFUSED = [
    *((core_cli, ["token"], "--member", value) for value in [BIGINT_OVER, "0", *NOT_CANONICAL]),
    (core_cli, ["retry-failed"], "--since", "99999999999d"),
    (core_cli, ["retry-failed"], "--since", "36501d"),
    (core_cli, ["retry-failed"], "--since", "0d"),
    (core_cli, ["retry-failed"], "--since", "1.5h"),
    (core_cli, ["retry-failed"], "--since", "1_0d"),
    (core_cli, ["retry-failed"], "--member", BIGINT_OVER),
    (core_cli, ["retry-failed"], "--member", "1_0"),
    (core_cli, ["retry-failed"], "--limit", BIGINT_OVER),
    (core_cli, ["retry-failed"], "--limit", "+5"),
    (core_cli, ["reprocess", "keywords"], "--rate", "10001"),
    (core_cli, ["reprocess", "keywords"], "--rate", "1_0"),
    (core_cli, ["reprocess", "keywords"], "--wait", "nan"),
    (core_cli, ["reprocess", "keywords"], "--wait", "inf"),
    (core_cli, ["reprocess", "keywords"], "--wait", "1e9"),
    (core_cli, ["reembed", "start", "--profile", "p"], "--rate", "0"),
    (core_cli, ["reembed", "start", "--profile", "p"], "--rate", " 5"),
    (core_cli, ["reembed", "cutover"], "--wait", "86401"),
    (core_cli, ["reembed", "rollback"], "--wait", "nan"),
    (core_cli, ["serve"], "--port", "65536"),
    (core_cli, ["serve"], "--port", "8_080"),
    (core_cli, ["serve"], "--ops-port", "99999999999999999999999"),
    (core_cli, ["serve"], "--limit-concurrency", "0"),
    (core_cli, ["serve"], "--max-header-bytes", "+2048"),
    (core_cli, ["serve"], "--head-timeout", "nan"),
    (core_cli, ["serve"], "--timeout-keep-alive", BIGINT_OVER),
    (worker_cli, ["serve"], "--port", "70000"),
    (worker_cli, ["serve"], "--timeout-graceful-shutdown", "1_0"),
    (worker_cli, ["serve"], "--head-timeout", "inf"),
    (worker_cli, ["smoke"], "--max-latency-seconds", "inf"),
    (worker_cli, ["demo"], "--port", "65536"),
    (worker_cli, ["demo"], "--core-port", "01"),
]


@pytest.mark.parametrize(("cli", "before", "option", "value"), REFUSED)
def test_an_out_of_range_or_non_canonical_number_is_a_usage_error(cli, before, option, value):
    result = CliRunner().invoke(cli, [*before, option, value], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.output


def _environment(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PINLOG_")}
    env.update(values)
    return env


async def _exit_code(arguments: list[str], env: dict[str, str]) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        *CORE, *arguments, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    _out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    return process.returncode or 0, err.decode()


async def test_the_reported_instances_exit_2_with_a_database_configured(migrated_database):
    """With every setting in place (so nothing but the option can be refused): a member id
    past BIGINT and a look-back past any timestamp are usage errors, not "database not
    ready" (4)."""
    env = _environment(
        PINLOG_CORE_DATABASE_URL=migrated_database, PINLOG_CORE_JWT_SECRET=JWT_SECRET
    )
    token = await _exit_code(["token", "--member", BIGINT_OVER], env)
    since = await _exit_code(["retry-failed", "--dry-run", "--since", "99999999999d"], env)
    assert token[0] == 2 and "--member" in token[1]
    assert since[0] == 2 and "--since" in since[1]


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        (["token", "--member", "9223372036854775807"], 0),
        (["retry-failed", "--dry-run", "--since", "36500d", "--limit", "5", "--member", "7"], 0),
    ],
)
async def test_the_edges_of_the_ranges_are_accepted(migrated_database, arguments, expected):
    env = _environment(
        PINLOG_CORE_DATABASE_URL=migrated_database, PINLOG_CORE_JWT_SECRET=JWT_SECRET
    )
    code, err = await _exit_code(arguments, env)
    assert code == expected, err
