"""The stage statements' connections: a plain asyncpg pool, one statement per checkout (§3).

Every statement of a context's hot path (start, claim, the two saves, fail) is one
data-modifying statement that commits on its own, so the pool needs no transactions, no
compilation per call and no result objects: each statement is a ``NamedStatement`` whose
``:name`` placeholders became asyncpg's ``$n`` once, at import
(``app.repository.named_statements``); asyncpg runs it, with its prepared-statement cache,
and hands back one row. Measured on the benchmark box this costs about a third of
SQLAlchemy's checkout-execute-return path per statement (docs/state-machine.md, "One
context, three statements"). Everything off the hot path (search, presets, migrations,
doctor, readiness) keeps the SQLAlchemy engines of ``app.repository.db``.

Connections are returned without asyncpg's reset query (one round trip per release): these
statements never leave anything to reset (no session ``SET``, advisory lock, ``LISTEN`` or
open cursor). A connection the server closed is replaced by the pool at the next checkout.

Connections that cannot serve are discarded (``pinlog_platform.db.sqlstates.
discards_connection``): every command has a deadline (``command_timeout_seconds``: the
server's ``statement_timeout``, then asyncpg's ``command_timeout`` a little later for a server
that does not answer), and on the latter, on a connection-level error, 57P0x or 25006 the
connection is
terminated (no cancel request through a peer that may be frozen) and every other pooled one is
expired, so a pool left on a read-only server after a failover reconnects by itself. A
statement refused with a connection-level error, 57P0x or 25006 changed nothing (each runs in
its own implicit transaction, and every stage statement is guarded by its row's state, so a
repeat of one whose answer was lost matches no row) and is retried once on a fresh
connection: a connection that died while pooled costs no stage. A deadline is not retried:
the budget is spent.

Errors (§6): a lock wait past ``lock_timeout`` raises ``DatabaseLockTimeout``; connection
loss, a full pool past ``POOL_TIMEOUT_SECONDS``, serialization failures and the other
transient SQLSTATEs raise ``DatabaseUnavailable``; any other database error, and a driver
error on a live connection (a wrong argument count, an argument it cannot encode), raises
``DatabaseStatementError`` naming only its SQLSTATE or error class (``app.errors``).
"""

from __future__ import annotations

from typing import Any

import asyncpg

from app.errors import DatabaseLockTimeout, DatabaseStatementError, DatabaseUnavailable
from app.repository.db import (
    COMMAND_TIMEOUT_SECONDS,
    CONNECT_TIMEOUT_SECONDS,
    SESSION_SETTINGS,
    register_vector_codec,
)
from app.repository.named_statements import NamedStatement
from pinlog_platform.db import connection
from pinlog_platform.db.sqlstates import (
    LOCK_NOT_AVAILABLE,
    TRANSIENT_SQLSTATE_PREFIXES,
    discards_connection,
    no_suitable_host,
)

# A task waiting this long for a connection gives up with a transient error, as the
# SQLAlchemy pools do (seconds).
POOL_TIMEOUT_SECONDS = 30.0


class StagePool:
    """asyncpg pool for the stage statements; build with ``await StagePool.open(...)``."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        transaction_pooling: bool,
        session_settings: dict[str, str] | None = None,
    ) -> None:
        self._pool = pool
        self._transaction_pooling = transaction_pooling
        self._set_local = connection.set_local_statement(
            dict(SESSION_SETTINGS) if session_settings is None else session_settings
        )
        # Statements run since open, one per ``fetch_row`` (the per-context statement budget
        # is checked against it: tests/worker/service/test_hot_path_budget.py).
        self.statements_run = 0

    @classmethod
    async def open(
        cls,
        database_url: str,
        *,
        size: int,
        transaction_pooling: bool = False,
        command_timeout_seconds: float = COMMAND_TIMEOUT_SECONDS,
    ) -> StagePool:
        """Open ``size`` connections lazily (at most) to a ``postgresql+asyncpg://`` URL (one
        host, or several in the accepted form: ``pinlog_platform.db.connection.driver_target``).

        ``transaction_pooling``: PgBouncer in transaction mode (``pinlog_platform.db.connection``):
        no statement cache, timeouts set per transaction. ``command_timeout_seconds``: the
        deadline of every statement (module docstring). Raises ``ConfigurationError`` on the
        first connection when the ``vector`` type is not on the search path.
        """

        session_settings = connection.with_command_deadline(
            dict(SESSION_SETTINGS), command_timeout_seconds
        )
        user_timeout = connection.client_deadline(command_timeout_seconds)

        async def init(conn: asyncpg.Connection) -> None:
            connection.configure_socket(conn, user_timeout_seconds=user_timeout)
            await register_vector_codec(conn)

        pool = await asyncpg.create_pool(
            **connection.driver_target(database_url),
            min_size=0,
            max_size=size,
            init=init,
            reset=_keep_session,
            timeout=CONNECT_TIMEOUT_SECONDS,
            **connection.driver_connect_args(
                session_settings,
                transaction_pooling=transaction_pooling,
                command_timeout_seconds=command_timeout_seconds,
            ),
        )
        return cls(pool, transaction_pooling=transaction_pooling, session_settings=session_settings)

    async def fetch_row(self, statement: NamedStatement, /, **params: Any) -> asyncpg.Record | None:
        """Run one statement in its own (implicit) transaction; its first row or ``None``.

        ``params``: one keyword per placeholder of ``statement`` (``:context_id`` is
        ``context_id=...``). A missing or unexpected keyword raises ``TypeError`` before any
        connection is taken (``NamedStatement.bind``). Raises ``DatabaseLockTimeout``,
        ``DatabaseUnavailable`` or ``DatabaseStatementError`` (module docstring).
        """
        args = statement.bind(params)
        self.statements_run += 1
        try:
            return await self._attempt(statement.sql, args)
        except Exception as exc:
            if not _retryable(exc):
                raise _translate(exc) from None
        # Refused before anything changed, on a connection now discarded: once more on a
        # fresh one (module docstring).
        try:
            return await self._attempt(statement.sql, args)
        except Exception as exc:
            raise _translate(exc) from None

    async def _attempt(self, sql: str, args: list[Any]) -> asyncpg.Record | None:
        """One try on one pooled connection; driver errors propagate untranslated, and a
        connection that cannot serve is discarded first."""
        async with self._pool.acquire(timeout=POOL_TIMEOUT_SECONDS) as conn:
            try:
                return await self._fetch_row(conn, sql, args)
            except Exception as exc:
                # (A cancelled caller is not one of these: asyncpg cancels the statement on
                # the server and the connection comes back usable, tests/worker/repository/
                # test_stage_pool_cancel.py.)
                closed = _is_closed(conn)
                if isinstance(exc, asyncpg.InternalClientError):
                    # The driver's protocol state is off ("another operation is in
                    # progress"), e.g. the server ended the session while it sat in the
                    # pool: the statement was not sent, and this connection cannot serve.
                    await self._discard(conn, closed=closed)
                    raise ConnectionError("database connection unusable") from exc
                if discards_connection(exc) or closed:
                    await self._discard(conn, closed=closed)
                if isinstance(exc, asyncpg.InterfaceError):
                    if closed:
                        raise ConnectionError("database connection lost") from exc
                    # Also DataError (an argument the driver could not encode: its message
                    # quotes the value): the call itself was wrong, a bug of ours.
                    raise _statement_error(exc) from None
                raise

    async def _discard(self, conn: asyncpg.Connection, *, closed: bool) -> None:
        """Terminate ``conn`` (no round trip) and have the pool replace every other connection
        at its next checkout: they may sit on the same read-only or vanished server."""
        if not closed:
            conn.terminate()
        await self._pool.expire_connections()

    async def _fetch_row(
        self, conn: asyncpg.Connection, sql: str, args: list[Any]
    ) -> asyncpg.Record | None:
        if not self._transaction_pooling:
            return await conn.fetchrow(sql, *args)
        # Through a transaction pooler the timeouts live in the transaction (SET LOCAL) and
        # prepare and execute must reach the same server connection.
        async with conn.transaction():
            if self._set_local:
                await conn.execute(self._set_local)
            return await conn.fetchrow(sql, *args)

    async def close(self) -> None:
        """Close every connection (waits for checked-out ones to come back)."""
        await self._pool.close()


async def _keep_session(_conn: asyncpg.Connection) -> None:
    """Release without asyncpg's reset query (module docstring)."""


def _is_closed(conn: asyncpg.Connection) -> bool:
    """``conn.is_closed()``; a proxy the pool already took back (its connection was lost)
    counts as closed."""
    try:
        return conn.is_closed()
    except asyncpg.InterfaceError:
        return True


def _retryable(exc: BaseException) -> bool:
    """Refused on a connection that cannot serve, changing nothing: a connection-level error,
    57P0x or 25006; not the command deadline (its budget is spent), nor anything else."""
    if isinstance(exc, TimeoutError):
        return False
    return discards_connection(exc)


def _translate(exc: Exception) -> Exception:
    """A driver error as the worker's error (module docstring); anything else as is."""
    if isinstance(exc, asyncpg.PostgresError):
        return _translate_driver_error(exc)
    if isinstance(exc, asyncpg.InterfaceError | OSError | TimeoutError) or no_suitable_host(exc):
        # The pool closed or closing (a statement's own InterfaceError became a
        # DatabaseStatementError in ``_attempt``), connection lost or refused, no host
        # accepting writes (mid-failover), a command past its deadline, or no connection
        # within the pool timeout.
        return DatabaseUnavailable("database unavailable")
    return exc


def _statement_error(exc: Exception) -> DatabaseStatementError:
    return DatabaseStatementError(f"stage statement failed: {type(exc).__name__}")


def _translate_driver_error(exc: asyncpg.PostgresError) -> Exception:
    state = str(getattr(exc, "sqlstate", "") or "")
    if state == LOCK_NOT_AVAILABLE:
        return DatabaseLockTimeout("database lock timeout")
    if state.startswith(TRANSIENT_SQLSTATE_PREFIXES):
        return DatabaseUnavailable("database unavailable")
    return DatabaseStatementError(
        f"stage statement failed: SQLSTATE {state or 'unknown'} ({type(exc).__name__})"
    )
