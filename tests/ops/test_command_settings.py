"""Both CLIs as a newcomer meets them: each command starts with only the settings it uses,
every bad setting (the log format included) is one line and exit 2, ``--version``, and
``--help`` in plain words (no reStructuredText markup, value names instead of types)."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest
import typer
from typer.testing import CliRunner

from app.cli import app as worker_cli
from core_service.cli import app as core_cli

WORKER = [sys.executable, "-m", "app.cli"]
CORE = [sys.executable, "-m", "core_service.cli"]
CLIS = {"pinlog-ai": worker_cli, "pinlog-core": core_cli}


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


def _commands(command, path: tuple[str, ...] = ()):
    """Every command and group under ``command`` (typer's own click classes)."""
    yield path, command
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name))


@pytest.mark.parametrize("program", sorted(CLIS))
def test_version_prints_the_program_and_its_version(program):
    result = CliRunner().invoke(CLIS[program], ["--version"], prog_name=program)
    assert result.exit_code == 0
    name, version = result.output.split()
    assert name == program and version[0].isdigit()


@pytest.mark.parametrize("program", sorted(CLIS))
def test_help_is_plain_words_with_value_names(program):
    checked = 0
    for path, _command in _commands(typer.main.get_command(CLIS[program])):
        result = CliRunner().invoke(CLIS[program], [*path, "--help"], prog_name=program)
        assert result.exit_code == 0, (path, result.output)
        assert "``" not in result.output, path
        for type_name in ("<bool>", "<int", "<str>", "<path>", "<float>"):
            assert type_name not in result.output, (path, type_name)
        checked += 1
    assert checked >= 5


async def test_doctor_needs_only_the_database_and_no_provider_key(migrated_database):
    code, out, err = await _run(
        [*WORKER, "doctor"], _environment(PINLOG_DATABASE_URL=migrated_database)
    )
    assert code == 0, err
    assert out.splitlines()[-1] == "doctor: 0 violation(s)"


async def test_doctor_on_an_unmigrated_database_says_to_migrate(empty_database):
    code, _, err = await _run([*WORKER, "doctor"], _environment(PINLOG_DATABASE_URL=empty_database))
    assert code == 4
    assert err.strip() == "pinlog-ai: database schema is missing: run `pinlog-ai db upgrade`"


@pytest.mark.parametrize(
    ("command", "prefix"),
    [
        ([*WORKER, "db", "upgrade"], "PINLOG_"),
        ([*WORKER, "doctor"], "PINLOG_"),
        ([*CORE, "db", "upgrade"], "PINLOG_CORE_"),
        ([*CORE, "token", "--member", "1"], "PINLOG_CORE_"),
    ],
)
async def test_an_invalid_log_format_is_exit_2_with_the_other_problems(command, prefix):
    """No fallback to text: reported with every other bad setting, one line each."""
    env = _environment(**{f"{prefix}LOG_FORMAT": "yaml"})
    code, out, err = await _run(command, env)
    lines = err.splitlines()
    program = "pinlog-ai" if prefix == "PINLOG_" else "pinlog-core"
    assert code == 2
    assert out == ""
    assert f"{program}: configuration error: {prefix}LOG_FORMAT" in "\n".join(lines)
    assert any(f"{prefix}DATABASE_URL" in line for line in lines)
    assert all(line.startswith(f"{program}: configuration error: {prefix}") for line in lines)
    assert "yaml" not in err
