"""The stage statements' connections: a plain asyncpg pool, one statement per checkout (§3).

Every statement of a context's hot path (start, claim, the two saves, fail) is one
data-modifying statement that commits on its own, so the pool needs no transactions, no
compilation per call and no result objects: each statement is a ``NamedStatement`` whose
``:name`` placeholders became asyncpg's ``$n`` once, at import
(``pinlog_platform.db.named_statements``); asyncpg runs it, with its prepared-statement cache,
and hands back one row. Measured on the benchmark box this costs about a third of
SQLAlchemy's checkout-execute-return path per statement (docs/state-machine.md, "One
context, three statements"). Everything off the hot path (search, presets, migrations,
doctor, readiness) keeps the SQLAlchemy engines of ``app.repository.db``.

Connections are returned without asyncpg's reset query (one round trip per release): these
statements never leave anything to reset (no session ``SET``, advisory lock, ``LISTEN`` or
open cursor). A connection the server closed is replaced by the pool at the next checkout.

Errors (§6): a lock wait past ``lock_timeout`` raises ``DatabaseLockTimeout``; connection
loss, a full pool past ``POOL_TIMEOUT_SECONDS``, serialization failures and the other
transient SQLSTATEs raise ``DatabaseUnavailable``; any other database error, and a driver
error on a live connection (a wrong argument count, an argument it cannot encode), raises
``DatabaseStatementError`` naming only its SQLSTATE or error class (``app.errors``).
"""

from __future__ import annotations

from typing import Any

import asyncpg
from sqlalchemy.engine import make_url

from app.errors import DatabaseLockTimeout, DatabaseStatementError, DatabaseUnavailable
from app.repository.db import CONNECT_TIMEOUT_SECONDS, SESSION_SETTINGS, register_vector_codec
from pinlog_platform.db import connection
from pinlog_platform.db.named_statements import NamedStatement
from pinlog_platform.db.sqlstates import LOCK_NOT_AVAILABLE, TRANSIENT_SQLSTATE_PREFIXES

# A task waiting this long for a connection gives up with a transient error, as the
# SQLAlchemy pools do (seconds).
POOL_TIMEOUT_SECONDS = 30.0


class StagePool:
    """asyncpg pool for the stage statements; build with ``await StagePool.open(...)``."""

    def __init__(self, pool: asyncpg.Pool, *, transaction_pooling: bool) -> None:
        self._pool = pool
        self._transaction_pooling = transaction_pooling
        self._set_local = connection.set_local_statement(SESSION_SETTINGS)
        # Statements run since open, one per ``fetch_row`` (the per-context statement budget
        # is checked against it: tests/worker/service/test_hot_path_budget.py).
        self.statements_run = 0

    @classmethod
    async def open(
        cls, database_url: str, *, size: int, transaction_pooling: bool = False
    ) -> StagePool:
        """Open ``size`` connections lazily (at most) to a ``postgresql+asyncpg://`` URL.

        ``transaction_pooling``: PgBouncer in transaction mode (``pinlog_platform.db.connection``):
        no statement cache, timeouts set per transaction. Raises ``ConfigurationError`` on the
        first connection when the ``vector`` type is not on the search path.
        """
        pool = await asyncpg.create_pool(
            _driver_dsn(database_url),
            min_size=0,
            max_size=size,
            init=register_vector_codec,
            reset=_keep_session,
            timeout=CONNECT_TIMEOUT_SECONDS,
            **connection.driver_connect_args(
                SESSION_SETTINGS, transaction_pooling=transaction_pooling
            ),
        )
        return cls(pool, transaction_pooling=transaction_pooling)

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
            async with self._pool.acquire(timeout=POOL_TIMEOUT_SECONDS) as conn:
                try:
                    return await self._fetch_row(conn, statement.sql, args)
                except asyncpg.InterfaceError as exc:
                    # Also DataError (an argument the driver could not encode: its message
                    # quotes the value). Transient only when the connection is gone; otherwise
                    # the call itself was wrong, a bug of ours.
                    if conn.is_closed():
                        raise DatabaseUnavailable("database unavailable") from None
                    raise _statement_error(exc) from None
        except asyncpg.PostgresError as exc:
            raise _translate_driver_error(exc) from None
        except asyncpg.InternalClientError as exc:
            raise _statement_error(exc) from None
        except (asyncpg.InterfaceError, OSError, TimeoutError):
            # Connection lost or refused, the pool closing, or no connection within the pool
            # timeout.
            raise DatabaseUnavailable("database unavailable") from None

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


def _driver_dsn(database_url: str) -> str:
    return make_url(database_url).set(drivername="postgresql").render_as_string(False)


async def _keep_session(_conn: asyncpg.Connection) -> None:
    """Release without asyncpg's reset query (module docstring)."""


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
