"""Engine, transactions and driver-error translation for the core service.

Every session runs with a ``lock_timeout``: a row held by a worker's save or another user
request makes a user request wait at most that long, then answer 503, instead of hanging.
Connection loss, lock and serialization failures, deadlocks and pool exhaustion become
``UnavailableError``; any other driver error propagates (a bug of ours, HTTP 500).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from core_service.errors import DatabaseFault, InvalidBodyError, UnavailableError
from pinlog_schema import connection

SESSION_SETTINGS = {
    "lock_timeout": "5s",
    "idle_in_transaction_session_timeout": "60s",
    "application_name": "pinlog-core",
}

# Connection exceptions (08), serialization failure, deadlock, lock not available, query
# cancelled (statement or lock timeout), server shutting down, insufficient resources.
_RETRYABLE_SQLSTATES = ("08", "40001", "40P01", "55P03", "57014", "57P0", "53")


def create_engine(
    database_url: str, *, pool_size: int = 10, transaction_pooling: bool = False
) -> AsyncEngine:
    """The async engine for a ``postgresql+asyncpg://`` URL; SQL parameters (note bodies)
    never appear in exception text. ``transaction_pooling`` is for PgBouncer in transaction
    mode: no startup parameters but ``application_name``, timeouts by ``SET LOCAL`` per
    transaction, no prepared-statement reuse (``pinlog_schema.connection``)."""
    engine = create_async_engine(
        database_url,
        pool_size=pool_size,
        max_overflow=0,
        pool_pre_ping=True,
        pool_timeout=10,
        hide_parameters=True,
        connect_args=connection.connect_args(
            SESSION_SETTINGS, transaction_pooling=transaction_pooling
        ),
    )
    if transaction_pooling:
        connection.apply_per_transaction(engine, SESSION_SETTINGS)
    return engine


def is_retryable(exc: BaseException) -> bool:
    """True for driver errors that a later attempt may not hit (see module docstring)."""
    if isinstance(exc, sa_exc.TimeoutError | OSError | ConnectionError | TimeoutError):
        return True
    if isinstance(exc, sa_exc.DBAPIError):
        if exc.connection_invalidated:
            return True
        sqlstate = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
        if sqlstate is None:
            return isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError)
        return str(sqlstate).startswith(_RETRYABLE_SQLSTATES)
    return False


# The CHECK that guards stored note bodies (pinlog_schema/sql/0007_core_context_body_check.sql).
BODY_CONSTRAINT = "context_body_normalised"


def _translated(exc: BaseException) -> Exception:
    """Our error for a driver error: retryable -> ``UnavailableError`` (503); the body CHECK ->
    ``InvalidBodyError`` (422); anything else -> ``DatabaseFault`` (500). Never the driver's
    message, which can quote the failing row (a member's note) into logs."""
    if is_retryable(exc):
        return UnavailableError("database unavailable")
    orig = getattr(exc, "orig", None)
    constraint = getattr(orig, "constraint_name", None) or getattr(
        getattr(orig, "__cause__", None), "constraint_name", None
    )
    if constraint == BODY_CONSTRAINT:
        return InvalidBodyError("body cannot be stored")
    sqlstate = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None) or "unknown"
    return DatabaseFault(f"database error {sqlstate}" + (f" on {constraint}" if constraint else ""))


@asynccontextmanager
async def transaction(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """One transaction: commit on normal exit, roll back on any exception.

    Driver errors become ``UnavailableError``, ``InvalidBodyError`` or ``DatabaseFault``
    (``_translated``).
    """
    try:
        async with engine.begin() as conn:
            yield conn
    except (sa_exc.SQLAlchemyError, OSError, ConnectionError, TimeoutError) as exc:
        translated = _translated(exc)
        if isinstance(translated, UnavailableError):
            raise translated from exc
        raise translated from None


@asynccontextmanager
async def read_only(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection for plain reads, each statement committing on its own (through a
    transaction pooler: one short read transaction, see ``pinlog_schema.connection``)."""
    if connection.uses_transaction_pooling(engine):
        async with transaction(engine) as conn:
            yield conn
        return
    try:
        async with engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            yield conn
    except (sa_exc.SQLAlchemyError, OSError, ConnectionError, TimeoutError) as exc:
        translated = _translated(exc)
        if isinstance(translated, UnavailableError):
            raise translated from exc
        raise translated from None
