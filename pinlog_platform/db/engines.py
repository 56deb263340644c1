"""The SQLAlchemy engine both services build, from one description of its parameters.

Each service lists its own ``EngineParameters`` in one place (its ``repository/db.py``): the
session settings (lock timeout and the like), pool timeout, pre-ping and the deadlines differ
because the services do different work; how an engine is put together does not.

Every engine of both services (§6):

- bounds every command (``COMMIT`` included): the server's ``statement_timeout`` cancels a
  slow statement cleanly, and asyncpg's ``command_timeout`` a little later ends the wait for a
  server that does not answer at all, terminating the connection instead of cancelling
  through a peer that may be frozen (``connection.with_command_deadline``);
- sets TCP keepalive and ``TCP_USER_TIMEOUT`` on each new socket
  (``pinlog_platform.db.connection.configure_socket``);
- throws away a connection that cannot serve (``sqlstates.discards_connection``: connection
  errors, the deadline, 57P0x, 25006), and with it every connection pooled before the error
  (SQLAlchemy's pool invalidation), so a pool left on a read-only server after a failover
  reconnects by itself;
- with ``pre_ping``, checks every reused connection at checkout with one round trip that also
  asks whether the session is read-only; a dead or read-only connection is replaced there
  and costs no request (readiness probes). Without it, a connection the driver already knows
  is closed (the server ended the session while it was pooled) is replaced at checkout with
  no round trip.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.util import await_only

from pinlog_platform.db import connection
from pinlog_platform.db.sqlstates import discards_connection

logger = logging.getLogger(__name__)

# A connection is checked at checkout only when reused: a new one has just answered.
_FRESH = "pinlog_fresh"

# One round trip: answers, and the session is not read-only (a standby, or a database with
# default_transaction_read_only after a failover).
READ_ONLY_CHECK = "SELECT pg_catalog.current_setting('transaction_read_only')"

# Deadline of the checkout check (seconds).
CHECKOUT_CHECK_SECONDS = 2.0

# Readiness of both services (§8): true when the database answers and accepts writes. A
# session opened while the server was read-only stays so; the checkout check above replaces it
# at the next probe, so readiness comes back by itself once the server accepts writes.
ACCEPTS_WRITES = "SELECT pg_catalog.current_setting('transaction_read_only') = 'off'"


@dataclass(frozen=True)
class EngineParameters:
    """What differs between the services' engines.

    ``session_settings`` maps PostgreSQL parameters to values (``{"lock_timeout": "3s"}``),
    sent at connect time, or ``SET LOCAL`` per transaction through a pooler.
    ``pool_timeout_seconds``: wait for a pooled connection before a transient error.
    ``pre_ping``: one round trip per reused checkout (module docstring; off the hot path).
    ``connect_timeout_seconds``: asyncpg's connect deadline (its default is 60 s).
    ``command_timeout_seconds``: deadline of every command (``None``: none, migrations).
    """

    session_settings: MappingProxyType[str, str]
    pool_timeout_seconds: float
    pre_ping: bool
    connect_timeout_seconds: float
    command_timeout_seconds: float | None = 5.0


def create_engine(
    database_url: str,
    parameters: EngineParameters,
    *,
    pool_size: int = 10,
    transaction_pooling: bool = False,
    pre_ping: bool | None = None,
    command_timeout_seconds: float | bool | None = False,
) -> AsyncEngine:
    """The async engine for a ``postgresql+asyncpg://`` URL.

    ``transaction_pooling`` is for PgBouncer in transaction mode (``pinlog_platform.db.
    connection``); ``pre_ping`` and ``command_timeout_seconds`` override ``parameters`` for
    one engine (``False``: keep the parameters'). SQL parameters (note bodies, vectors) never
    appear in exception text (§6).
    """
    command_timeout = (
        parameters.command_timeout_seconds
        if command_timeout_seconds is False
        else command_timeout_seconds
    )
    settings = connection.with_command_deadline(
        dict(parameters.session_settings),
        command_timeout,  # type: ignore[arg-type]
    )
    connect_args: dict[str, Any] = {
        **connection.connect_args(
            settings,
            transaction_pooling=transaction_pooling,
            command_timeout_seconds=command_timeout,  # type: ignore[arg-type]
        ),
        "timeout": parameters.connect_timeout_seconds,
    }
    engine = create_async_engine(
        database_url,
        pool_size=pool_size,
        max_overflow=0,
        pool_pre_ping=False,
        pool_timeout=parameters.pool_timeout_seconds,
        hide_parameters=True,
        connect_args=connect_args,
    )
    user_timeout = (
        connection.client_deadline(float(command_timeout))
        if command_timeout
        else parameters.connect_timeout_seconds
    )
    install_connection_checks(
        engine,
        pre_ping=parameters.pre_ping if pre_ping is None else pre_ping,
        user_timeout_seconds=user_timeout,
        transaction_pooling=transaction_pooling,
    )
    if transaction_pooling:
        connection.apply_per_transaction(engine, settings)
    return engine


def install_connection_checks(
    engine: AsyncEngine,
    *,
    pre_ping: bool,
    user_timeout_seconds: float,
    transaction_pooling: bool = False,
) -> None:
    """Socket options on connect, discarding on errors, and the checkout check (module
    docstring)."""
    sync_engine = engine.sync_engine

    @event.listens_for(sync_engine, "connect")
    def _on_connect(dbapi_connection, connection_record) -> None:
        connection.configure_socket(
            dbapi_connection.driver_connection, user_timeout_seconds=user_timeout_seconds
        )
        connection_record.info[_FRESH] = True

    @event.listens_for(sync_engine, "handle_error")
    def _on_error(context) -> None:
        if not discards_connection(context.original_exception):
            return
        # Terminate at once: a graceful close would wait on a peer that may not answer.
        dbapi_connection = _dbapi_connection(context.connection)
        if dbapi_connection is not None:
            terminate(dbapi_connection.driver_connection)
        context.is_disconnect = True

    if not pre_ping:

        @event.listens_for(sync_engine, "checkout")
        def _check_open(dbapi_connection, _connection_record, _proxy) -> None:
            # Free: asyncpg saw the server close the session while it was pooled (a restart,
            # a failover, a terminated backend); SQLAlchemy then checks out another.
            if dbapi_connection.driver_connection.is_closed():
                raise sa_exc.DisconnectionError("connection was closed while pooled")

        return
    # The check is one trivial round trip: a server that does not answer it quickly is
    # treated as gone, and the connection replaced, instead of spending a command deadline.
    check_timeout = min(CHECKOUT_CHECK_SECONDS, user_timeout_seconds)

    @event.listens_for(sync_engine, "checkout")
    def _check(dbapi_connection, connection_record, _proxy) -> None:
        if connection_record.info.pop(_FRESH, False):
            return
        driver = dbapi_connection.driver_connection
        try:
            if transaction_pooling:
                # Through a pooler the server connection is anyone's: only check it answers
                # (one simple-protocol round trip).
                await_only(driver.execute("SELECT 1", timeout=check_timeout))
                read_only = False
            else:
                read_only = (
                    await_only(driver.fetchval(READ_ONLY_CHECK, timeout=check_timeout)) == "on"
                )
        except Exception as exc:  # any failure: this connection cannot serve
            terminate(dbapi_connection.driver_connection)
            raise sa_exc.DisconnectionError(
                f"connection check failed: {type(exc).__name__}"
            ) from None
        if read_only:
            terminate(dbapi_connection.driver_connection)
            raise sa_exc.DisconnectionError("connection is on a read-only server")


def terminate(driver_connection: Any) -> None:
    """Close an asyncpg connection without a round trip (never raises)."""
    try:
        if not driver_connection.is_closed():
            driver_connection.terminate()
    except Exception:  # best effort on a connection being thrown away
        logger.debug("terminate failed", exc_info=True)


def _dbapi_connection(conn: Any) -> Any:
    if conn is None:
        return None
    try:
        return conn.connection.dbapi_connection
    except Exception:  # already invalidated or closed
        return None
