"""How every ``pinlog-core`` command starts and meets its database: its settings (exit 2, one
line per problem), a database that cannot be reached (exit 3) or is not usable by this role
(exit 4), and the one ``Operations`` value an operator command runs on
(``core_service/composition.py``)."""

from __future__ import annotations

import itertools
import re
import sys
from collections.abc import Awaitable, Callable
from typing import NoReturn, TypeVar

from pinlog_platform import tracing
from pinlog_platform.cli import exit_codes, startup

T = TypeVar("T")

PROGRAM = "pinlog-core"


def load(settings_class):
    """Read the command's settings and the logging settings (``PINLOG_CORE_LOG_FORMAT``,
    ``PINLOG_CORE_LOG_LEVEL``), then configure logging; or exit 2 with one line per problem of
    either, all at once (never a value, never a trace)."""
    from core_service.settings import ENV_PREFIX, LoggingSettings, TracingSettings

    return startup.load_settings(
        PROGRAM,
        settings_class,
        prefix=ENV_PREFIX,
        logging_class=LoggingSettings,
        tracing_class=TracingSettings,
    )


def classify(exc: BaseException) -> startup.StartupProblem | None:
    """A database that cannot be reached is exit 3 with one line; one reached but not usable
    by this role (no schema, a missing privilege, a refused login) is exit 4 (3 for the
    login); anything else is a bug."""
    from core_service.errors import DatabaseFault, UnavailableError
    from pinlog_platform.contract.schema import MigrationPrivilegeError
    from pinlog_platform.db.sqlstates import is_transient, sqlstate

    if isinstance(exc, MigrationPrivilegeError):
        return startup.StartupProblem(exit_codes.DATABASE_NOT_READY, f"migration error: {exc}")
    cause = exc.__cause__ if isinstance(exc, UnavailableError) else exc
    state = sqlstate(cause) if cause is not None else None
    if state is None and isinstance(exc, DatabaseFault):
        state = str(exc).removeprefix("database error ").split(" ")[0]
    if state is not None and state.startswith("28"):
        return startup.StartupProblem(
            exit_codes.DATABASE_UNREACHABLE,
            "database error: the database refused the login (PINLOG_CORE_DATABASE_URL)",
        )
    if state in NOT_READY_STATES:
        return startup.StartupProblem(exit_codes.DATABASE_NOT_READY, NOT_READY_STATES[state])
    if isinstance(exc, UnavailableError):
        return startup.StartupProblem(
            exit_codes.DATABASE_UNREACHABLE, "database error: database unavailable"
        )
    if isinstance(exc, OSError) or is_transient(exc):
        return startup.StartupProblem(
            exit_codes.DATABASE_UNREACHABLE,
            f"database error: cannot reach the database ({type(exc).__name__})",
        )
    if isinstance(exc, DatabaseFault):
        return startup.StartupProblem(exit_codes.DATABASE_NOT_READY, f"database error: {exc}")
    return None


_NO_SCHEMA = "database error: the schema is missing: run `pinlog-core db upgrade`"
NOT_READY_STATES = {
    "42P01": _NO_SCHEMA,
    "3F000": _NO_SCHEMA,
    "3D000": "database error: the database named in PINLOG_CORE_DATABASE_URL does not exist",
    "42501": (
        "database error: the database role lacks privileges on schema core "
        "(run the core as the schema owner or its own role, docs/deployment.md)"
    ),
}


def run_with_database(step: Callable[[], Awaitable[T]]) -> T:
    """Run the async ``step``; a database that cannot be reached exits 3 with one line."""
    return startup.run_step(PROGRAM, step, classify)


def run_operation(settings, step: Callable[..., Awaitable[T]]) -> T:
    """Run ``step(operations)`` on the one ``Operations`` of this command run, opened on
    ``settings`` and closed when ``step`` ends (``composition.open_operations``); database
    faults exit as ``run_with_database``'s. With traces on, the run is one trace of its own
    (``pinlog-core <command>``; the dispatches it makes continue it to the workers)."""
    from core_service.composition import open_operations

    async def run() -> T:
        with tracing.span(command_name(), new_trace=True):
            async with open_operations(settings) as operations:
                return await step(operations)

    return run_with_database(run)


def command_name() -> str:
    """``pinlog-core`` and the words naming the command being run (``pinlog-core reembed
    start``): at most the first two command-line words that look like command names, never an
    option or an argument's value."""
    words = list(itertools.takewhile(_COMMAND_WORD.fullmatch, sys.argv[1:3]))
    return " ".join([PROGRAM, *words])


# The commands' names: lower-case words and hyphens (an id or an option never matches).
_COMMAND_WORD = re.compile(r"[a-z][a-z-]*")


def fail(exit_code: int, lines) -> NoReturn:
    """Print each line as ``pinlog-core: {line}`` on stderr and exit with ``exit_code``."""
    startup.fail(PROGRAM, exit_code, lines)
