"""``pinlog-ai demo`` is registered from the development-only ``demo`` package through the
``pinlog_ai.commands`` entry point (``app/cli.py`` ``COMMAND_PLUGINS``), never imported by the
product; where that package is not installed the command still answers with one line and
exit 2 (the production image)."""

from __future__ import annotations

from importlib.metadata import entry_points

import typer
from typer.testing import CliRunner

from app import cli as worker_cli_module
from app.cli import COMMAND_PLUGINS
from app.cli import app as worker_cli


def test_the_demo_is_registered_from_its_own_package():
    (entry,) = [e for e in entry_points(group=COMMAND_PLUGINS) if e.name == "demo"]
    assert entry.value == "demo.cli:register"
    (command,) = [c for c in worker_cli.registered_commands if c.name == "demo"]
    assert command.callback.__module__ == "demo.cli"


def test_the_demo_keeps_its_options():
    result = CliRunner().invoke(worker_cli, ["demo", "--help"], prog_name="pinlog-ai")
    assert result.exit_code == 0
    for option in ("--port", "--core-port", "--serve / --no-serve", "--data-dir", "--operations"):
        assert option in result.output


def test_a_command_whose_package_is_missing_exits_2_with_one_line():
    cli = typer.Typer()
    cli.command()(lambda: None)  # a second command, so "demo" is a subcommand
    worker_cli_module._add_unavailable(cli, "demo")
    result = CliRunner().invoke(cli, ["demo", "--port", "1", "--no-serve"], prog_name="pinlog-ai")
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("demo unavailable: ") and "from a source checkout" in lines[0]
