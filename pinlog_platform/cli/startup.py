"""Startup problems of both CLIs as one line each and a distinct exit code.

Configuration and connectivity problems at startup are the operator's to fix, not bugs: they
never end in a traceback. Every line starts with the program's name (``pinlog-ai: ...``,
``pinlog-core: ...``) and never carries URLs, passwords, keys or upstream text. Exit codes are
those of ``pinlog_platform.cli.exit_codes``.

One mechanism for both services: ``load_settings`` reads a settings class or exits 2 listing
every problem; ``run_step`` runs one async startup step and turns what the service's
``classify`` recognises into its line and exit code (anything else is a bug of ours, and its
traceback is the useful output).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import typer
from pydantic import ValidationError

from pinlog_platform import logging as log_output
from pinlog_platform import tracing
from pinlog_platform.cli import exit_codes
from pinlog_platform.settings_rules import describe_errors

T = TypeVar("T")


@dataclass(frozen=True)
class StartupProblem:
    """What to print (one line, no secrets) and the exit code."""

    exit_code: int
    message: str


Classify = Callable[[BaseException], StartupProblem | None]


def fail(program: str, exit_code: int, lines: Iterable[str]) -> NoReturn:
    """Print each line as ``{program}: {line}`` on stderr and exit with ``exit_code``."""
    for line in lines:
        typer.echo(f"{program}: {line}", err=True)
    raise typer.Exit(exit_code)


def load_settings(
    program: str,
    settings_class: Callable[[], T],
    *,
    prefix: str,
    logging_class: Callable[[], Any] | None = None,
    tracing_class: Callable[[], Any] | None = None,
) -> T:
    """``settings_class()``, or exit 2 with one ``configuration error`` line per problem, all
    at once, each naming the ``{prefix}*`` variable and never its value.

    With ``logging_class`` (the service's ``LOG_FORMAT`` / ``LOG_LEVEL`` settings), its problems
    are reported together with the command's, like any other bad setting (exit 2, no fallback),
    and the log output is configured from it before the command goes on. With
    ``tracing_class`` (the service's ``OTEL_EXPORTER_OTLP_ENDPOINT``), likewise, and traces are
    exported as ``program`` when an endpoint is set (``pinlog_platform.tracing``)."""
    problems: list[str] = []
    chosen_logging, chosen_tracing, settings = None, None, None
    if logging_class is not None:
        try:
            chosen_logging = logging_class()
        except ValidationError as exc:
            problems += describe_errors(exc, prefix=prefix)
    if tracing_class is not None:
        try:
            chosen_tracing = tracing_class()
        except ValidationError as exc:
            problems += describe_errors(exc, prefix=prefix)
    try:
        settings = settings_class()
    except ValidationError as exc:
        problems += describe_errors(exc, prefix=prefix)
    if problems:
        fail(program, exit_codes.CONFIGURATION, [f"configuration error: {p}" for p in problems])
    if chosen_logging is not None:
        log_output.configure(chosen_logging.log_format, chosen_logging.log_level)
    if chosen_tracing is not None:
        tracing.configure(program, chosen_tracing.otel_exporter_otlp_endpoint)
    return settings


def run_step(program: str, step: Callable[[], Awaitable[T]], classify: Classify) -> T:
    """Run one async startup step; an exception ``classify`` recognises exits with its line
    and code, any other propagates."""
    try:
        return asyncio.run(step())
    except Exception as exc:
        problem = classify(exc)
        if problem is None:
            raise
        fail(program, problem.exit_code, [problem.message])
