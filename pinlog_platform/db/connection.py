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

import socket
import uuid
import weakref
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection, make_url
from sqlalchemy.ext.asyncio import AsyncEngine

# Only these may be sent when connecting through PgBouncer (its own list of tracked
# parameters); everything else becomes SET LOCAL.
POOLER_STARTUP_PARAMETERS = frozenset({"application_name"})

# Engines built for a transaction pooler (by ``apply_per_transaction``).
_POOLED_ENGINES: weakref.WeakSet = weakref.WeakSet()


def driver_connect_args(
    session_settings: dict[str, str],
    *,
    transaction_pooling: bool,
    command_timeout_seconds: float | None = None,
) -> dict[str, Any]:
    """Keyword arguments of ``asyncpg.connect`` / ``asyncpg.create_pool``.

    ``session_settings`` maps PostgreSQL parameters to values (``{"lock_timeout": "3s"}``).
    ``command_timeout_seconds``: the deadline of every command of the connection (statements,
    ``COMMIT`` included); ``None`` for none (migrations). See ``with_command_deadline``.
    """
    args: dict[str, Any]
    if not transaction_pooling:
        args = {"server_settings": dict(session_settings)}
    else:
        args = {
            "server_settings": {
                name: value
                for name, value in session_settings.items()
                if name in POOLER_STARTUP_PARAMETERS
            },
            "statement_cache_size": 0,
        }
    if command_timeout_seconds is not None:
        args["command_timeout"] = client_deadline(command_timeout_seconds)
    return args


# Options of SQLAlchemy's asyncpg dialect, not of asyncpg itself.
_DIALECT_ONLY_OPTIONS = ("prepared_statement_cache_size", "prepared_statement_name_func")


def driver_target(database_url: str) -> dict[str, Any]:
    """Where ``asyncpg.connect`` / ``asyncpg.create_pool`` connects for a
    ``postgresql+asyncpg://`` URL, as keyword arguments (``host``, ``port``, ``user``,
    ``password``, ``database`` and the query's options such as ``target_session_attrs``),
    read exactly as SQLAlchemy's engines read it: one accepted syntax, several hosts included
    (``?host=HOST1:PORT&host=HOST2:PORT``, ``pinlog_platform.settings_rules.
    SEVERAL_HOSTS_FORM``), so the worker's stage pool fails over like its engines."""
    url = make_url(database_url)
    _, options = url.get_dialect()().create_connect_args(url)
    for name in _DIALECT_ONLY_OPTIONS:
        options.pop(name, None)
    return options


def with_command_deadline(
    session_settings: dict[str, str], command_timeout_seconds: float | None
) -> dict[str, str]:
    """``session_settings`` plus the server's side of the command deadline.

    The deadline has two sides. The server's ``statement_timeout`` (this) cancels a statement
    that runs or waits on a lock too long: it fails cleanly (57014, transient), nothing it did
    stays, and the connection goes on serving. The driver's ``command_timeout``
    (``client_deadline``, a little later) ends the wait when the server does not answer at
    all (a silent peer): the connection is then terminated, never cancelled through the path
    that stopped answering (``pinlog_platform.db.engines``).
    """
    settings = dict(session_settings)
    if command_timeout_seconds is not None:
        settings["statement_timeout"] = f"{max(1, int(command_timeout_seconds * 1000))}ms"
    return settings


def client_deadline(command_timeout_seconds: float) -> float:
    """The driver's deadline for a command: the server's ``statement_timeout`` plus a margin
    for its answer to arrive (a quarter of it, between 0.2 s and 1 s)."""
    return command_timeout_seconds + min(1.0, max(0.2, command_timeout_seconds / 4))


# TCP keepalive of every database socket: the first probe after this many idle seconds, then
# one every KEEPALIVE_INTERVAL_SECONDS, KEEPALIVE_PROBES unanswered probes end the connection.
KEEPALIVE_IDLE_SECONDS = 10
KEEPALIVE_INTERVAL_SECONDS = 5
KEEPALIVE_PROBES = 3


def configure_socket(driver_connection: Any, *, user_timeout_seconds: float) -> None:
    """TCP keepalive and ``TCP_USER_TIMEOUT`` on an asyncpg connection's socket.

    asyncpg has no keepalive option, so a database host that stops answering (half-open TCP
    after a failover, a partition, a NAT that dropped its state) would leave an idle pooled
    connection open forever and a busy one waiting until the command deadline. Keepalive
    probes end an idle one within ``KEEPALIVE_IDLE_SECONDS + KEEPALIVE_INTERVAL_SECONDS *
    KEEPALIVE_PROBES`` (25 s); ``TCP_USER_TIMEOUT`` ends one whose sent data stays
    unacknowledged for ``user_timeout_seconds``. Options the platform lacks are skipped (only
    Linux has all of them); a Unix socket has none.
    """
    transport = getattr(driver_connection, "_transport", None)
    sock = None if transport is None else transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    options = [
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPIDLE", None), KEEPALIVE_IDLE_SECONDS),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", None), KEEPALIVE_INTERVAL_SECONDS),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", None), KEEPALIVE_PROBES),
        (
            socket.IPPROTO_TCP,
            getattr(socket, "TCP_USER_TIMEOUT", None),
            max(1, int(user_timeout_seconds * 1000)),
        ),
    ]
    for level, option, value in options:
        if option is not None:
            sock.setsockopt(level, option, value)


def connect_args(
    session_settings: dict[str, str],
    *,
    transaction_pooling: bool,
    command_timeout_seconds: float | None = None,
) -> dict[str, Any]:
    """The asyncpg ``connect_args`` for ``create_async_engine``: the driver's, plus SQLAlchemy's
    own statement cache off under a pooler (see the module docstring)."""
    args = driver_connect_args(
        session_settings,
        transaction_pooling=transaction_pooling,
        command_timeout_seconds=command_timeout_seconds,
    )
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
