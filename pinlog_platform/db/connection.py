"""How both services connect to the shared database: directly, or through a transaction pooler.

Directly, per-session timeouts travel as startup parameters (``server_settings``). PgBouncer in
``pool_mode = transaction`` refuses those ("unsupported startup parameter: lock_timeout") and
hands each transaction to whichever server connection is free, so a prepared statement made in
one transaction is missing in the next ("prepared statement does not exist"). With
``transaction_pooling`` on, following SQLAlchemy's asyncpg dialect documentation ("Prepared
Statement Name with PGBouncer") and asyncpg's FAQ:

- asyncpg's statement cache is off (``statement_cache_size=0``) and so is SQLAlchemy's
  (``prepared_statement_cache_size=0``); the statements SQLAlchemy still prepares get unique
  names, so two clients sharing a server connection never collide;
- SQLAlchemy prepares every statement (``prepare`` and ``execute`` are two round trips), and
  outside a transaction the pooler may send them to two different server connections; so the
  services' autocommit helpers run their statements in one short explicit transaction
  instead (``uses_transaction_pooling``);
- the timeouts are set with ``SET LOCAL`` (``set_config(..., true)``) at the start of every
  explicit transaction, where they end with the transaction and never leak to the next
  client of that server connection.
"""

from __future__ import annotations

import uuid
import weakref
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

# Only these may be sent when connecting through PgBouncer (its own list of tracked
# parameters); everything else becomes SET LOCAL.
POOLER_STARTUP_PARAMETERS = frozenset({"application_name"})

# Engines built for a transaction pooler (by ``apply_per_transaction``).
_POOLED_ENGINES: weakref.WeakSet = weakref.WeakSet()


def driver_connect_args(
    session_settings: dict[str, str], *, transaction_pooling: bool
) -> dict[str, Any]:
    """Keyword arguments of ``asyncpg.connect`` / ``asyncpg.create_pool``.

    ``session_settings`` maps PostgreSQL parameters to values (``{"lock_timeout": "3s"}``).
    """
    if not transaction_pooling:
        return {"server_settings": dict(session_settings)}
    return {
        "server_settings": {
            name: value
            for name, value in session_settings.items()
            if name in POOLER_STARTUP_PARAMETERS
        },
        "statement_cache_size": 0,
    }


def connect_args(session_settings: dict[str, str], *, transaction_pooling: bool) -> dict[str, Any]:
    """The asyncpg ``connect_args`` for ``create_async_engine``: the driver's, plus SQLAlchemy's
    own statement cache off under a pooler (see the module docstring)."""
    args = driver_connect_args(session_settings, transaction_pooling=transaction_pooling)
    if transaction_pooling:
        args["prepared_statement_cache_size"] = 0
        args["prepared_statement_name_func"] = _unique_statement_name
    return args


def _unique_statement_name() -> str:
    return f"__asyncpg_{uuid.uuid4().hex}__"


def set_local_statement(session_settings: dict[str, str]) -> str:
    """One statement setting every non-startup parameter for the current transaction only
    (``set_config(name, value, true)`` is ``SET LOCAL``; one statement, because a prepared
    statement may hold only one command). Empty when there is nothing to set.

    Names and values come from the services' own constants, never from input.
    """
    calls = [
        f"set_config('{name}', '{value}', true)"
        for name, value in session_settings.items()
        if name not in POOLER_STARTUP_PARAMETERS
    ]
    return f"SELECT {', '.join(calls)}" if calls else ""


def apply_per_transaction(engine: AsyncEngine, session_settings: dict[str, str]) -> None:
    """Run ``SET LOCAL`` for ``session_settings`` at the start of every explicit transaction
    of ``engine`` (autocommit connections are left alone: see the module docstring)."""
    _POOLED_ENGINES.add(engine.sync_engine)
    statement = set_local_statement(session_settings)
    if not statement:
        return

    @event.listens_for(engine.sync_engine, "begin")
    def _set_local(conn: Connection) -> None:
        if conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT":
            return
        # The driver opens the transaction (BEGIN) before this first statement, so the values
        # end with it.
        conn.exec_driver_sql(statement)


def uses_transaction_pooling(engine: AsyncEngine) -> bool:
    """True for an engine set up by ``apply_per_transaction``: it must not run statements
    outside an explicit transaction (see the module docstring)."""
    return engine.sync_engine in _POOLED_ENGINES
