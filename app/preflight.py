"""Startup problems of the ``pinlog-ai`` commands as one line and a distinct exit code.

Configuration and connectivity problems at startup are the operator's to fix, not bugs: they
never end in a traceback. Each maps to an exit code of ``pinlog_platform.cli.exit_codes``
(2 settings, 3 database unreachable, 4 database not ready, 5 provider).

Lines name what is wrong and never carry URLs, passwords, keys or upstream text.
"""

from __future__ import annotations

import asyncio

from sqlalchemy import exc as sa_exc
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.errors import ConfigurationError, DatabaseUnavailable, WorkerError
from app.repository.db import (
    CONNECT_TIMEOUT_SECONDS,
    PING,
    VECTOR_TYPE_MISSING,
    autocommit,
)
from pinlog_platform.cli import exit_codes
from pinlog_platform.cli.startup import StartupProblem
from pinlog_platform.db.sqlstates import sqlstate

# The table and the extension's type every command after ``db upgrade`` needs.
SCHEMA_PRESENT = text(
    "SELECT to_regclass('ai.keyword_preset') IS NOT NULL AS tables, "
    "to_regtype('vector') IS NOT NULL AS vector_type"
)
_NO_SCHEMA = "database schema is missing: run `pinlog-ai db upgrade`"
# The core's tables come from the core's migrations, which the worker's upgrade skips.
_NO_CORE_SCHEMA = "core tables are missing: run `pinlog-core db upgrade` (every migration)"

# SQLSTATE classes and codes a command cannot get past, with what to tell the operator.
_UNREACHABLE_STATES = {
    "28": "database refused the login (check user and password in PINLOG_DATABASE_URL)",
    "3D000": "database named in PINLOG_DATABASE_URL does not exist",
}
_NOT_READY_STATES = {
    "42P01": _NO_SCHEMA,
    "3F000": _NO_SCHEMA,
    "42501": "database role lacks privileges on schema ai (docs/operations.md)",
}


async def check_database(engine: AsyncEngine, *, schema: bool = False) -> None:
    """One round trip; raises what the driver raised (classified by ``classify``), and with
    ``schema`` a ``ConfigurationError`` when the migrations were not applied. ``engine`` must
    not register the vector codec, which fails on a database without the extension."""
    async with asyncio.timeout(CONNECT_TIMEOUT_SECONDS + 2), autocommit(engine) as conn:
        await conn.execute(PING)
        if not schema:
            return
        present = (await conn.execute(SCHEMA_PRESENT)).one()
        if not present.tables:
            raise ConfigurationError(_NO_SCHEMA)
        if not present.vector_type:
            # Migrated, but the extension's schema is not on this role's search path.
            raise ConfigurationError(VECTOR_TYPE_MISSING)


def classify(exc: BaseException) -> StartupProblem | None:
    """The ``StartupProblem`` for ``exc``, or ``None`` when it is a bug of ours."""
    cause = exc.__cause__ if isinstance(exc, DatabaseUnavailable) else exc
    if isinstance(exc, ConfigurationError):
        return StartupProblem(exit_codes.DATABASE_NOT_READY, str(exc))
    if isinstance(cause, sa_exc.DBAPIError):
        state = sqlstate(cause) or ""
        for prefix, message in _UNREACHABLE_STATES.items():
            if state.startswith(prefix):
                return StartupProblem(exit_codes.DATABASE_UNREACHABLE, message)
        if state == "42P01" and _names_a_core_relation(cause):
            return StartupProblem(exit_codes.DATABASE_NOT_READY, _NO_CORE_SCHEMA)
        if state in _NOT_READY_STATES:
            return StartupProblem(exit_codes.DATABASE_NOT_READY, _NOT_READY_STATES[state])
    if isinstance(exc, DatabaseUnavailable | OSError | TimeoutError | sa_exc.InterfaceError):
        reason = type(_root(exc)).__name__
        return StartupProblem(
            exit_codes.DATABASE_UNREACHABLE,
            f"database unreachable ({reason}): check PINLOG_DATABASE_URL",
        )
    if isinstance(exc, sa_exc.DBAPIError):
        return StartupProblem(
            exit_codes.DATABASE_NOT_READY,
            f"database error {sqlstate(exc) or type(exc.orig).__name__}",
        )
    if isinstance(exc, WorkerError):  # our fixed messages: "embedding upstream 401", ...
        return StartupProblem(exit_codes.PROVIDER, f"embedding provider: {exc}")
    return None


def _names_a_core_relation(exc: sa_exc.DBAPIError) -> bool:
    """Whether an undefined-table error is about a ``core.`` relation (read, never printed:
    the server's message names the relation, ``relation "core.context" does not exist``)."""
    return '"core.' in str(getattr(exc, "orig", exc))


def _root(exc: BaseException) -> BaseException:
    seen: set[int] = set()
    while exc.__cause__ is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc = exc.__cause__
    return getattr(exc, "orig", None) or exc
