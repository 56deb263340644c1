"""``pinlog-core status [--json]``: backlog, lag, coverage, failures and retries of live
contexts, the pause state, and the provider spend (docs/operations.md "Status").

The figures are ``service/status.py``'s, the ones every ``serve`` process sets its gauges from.
"""

from __future__ import annotations

import json

import typer

from core_service.command_startup import load, run_operation
from core_service.composition import Operations
from core_service.service.status import StatusReport, read_status
from pinlog_platform.contract.search.terms import ANALYSER_VERSION

commands = typer.Typer(rich_markup_mode=None)


async def current_status(operations: Operations) -> StatusReport:
    """The status now (two statements: the counts, then the search index's coverage under
    the analyser in use)."""
    return await read_status(
        operations.engine,
        processing_expiry_seconds=operations.settings.processing_expiry_seconds,
        analyser_version=ANALYSER_VERSION,
    )


@commands.command()
def status(
    as_json: bool = typer.Option(False, "--json", help="One JSON object (docs/operations.md)"),
) -> None:
    """Backlog, lag, coverage, failures and retries of live contexts, the pause state, and
    today's and this month's provider spend."""
    from core_service.settings import StateClockSettings

    report = run_operation(load(StateClockSettings), current_status)
    typer.echo(json.dumps(report.as_json()) if as_json else report.as_text())
