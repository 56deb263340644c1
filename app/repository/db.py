"""Engine construction, transactions, and driver-error translation at the boundary (§6).

Vectors cross the driver as ``numpy.ndarray`` (pgvector's asyncpg codec, registered per
connection). A lock wait past ``lock_timeout`` becomes ``DatabaseLockTimeout("database lock
timeout")`` (the database is up, a row is busy); connection loss, serialization failures,
timeouts and pool exhaustion become ``DatabaseUnavailable("database unavailable")``; every other
driver error propagates as is (a bug of ours, HTTP 500).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import numpy as np
from pgvector import Vector
from pgvector.asyncpg import register_vector
from sqlalchemy import event, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from app.errors import ConfigurationError, DatabaseLockTimeout, DatabaseUnavailable
from pinlog_schema import connection

# SQLSTATEs that mean "try again later": connection exceptions (08), serialization failure,
# deadlock, lock not available, statement timeout / cancel, server shutdown, resources (53).
TRANSIENT_SQLSTATE_PREFIXES = ("08", "40001", "40P01", "55P03", "57014", "57P0", "53")
LOCK_NOT_AVAILABLE = "55P03"


def create_engine(
    database_url: str,
    *,
    pool_size: int = 10,
    with_vector_codec: bool = True,
    transaction_pooling: bool = False,
    pre_ping: bool = False,
) -> AsyncEngine:
    """Build the async engine for a ``postgresql+asyncpg://`` URL.

    ``with_vector_codec=False`` is for migrations, which run before the extension exists.
    ``transaction_pooling`` is for PgBouncer in transaction mode (``pinlog_schema.connection``).
    Connecting raises ``ConfigurationError`` when the ``vector`` type is not on the search path.
    ``pre_ping=True`` pings every connection at checkout (one round trip each): only for
    engines off the hot path (readiness, tooling). Without it a connection that died while
    pooled fails its statement as a transient error (§6), and SQLAlchemy then recycles every
    connection pooled before the failure, so one stage pays for a lost database session.
    """
    engine = create_async_engine(
        database_url,
        pool_size=pool_size,
        max_overflow=0,
        pool_pre_ping=pre_ping,
        pool_timeout=30,
        # Parameters carry vectors and model output: never into exception text or logs (§6).
        hide_parameters=True,
        connect_args={
            **connection.connect_args(SESSION_SETTINGS, transaction_pooling=transaction_pooling),
            "timeout": CONNECT_TIMEOUT_SECONDS,
        },
    )
    if transaction_pooling:
        connection.apply_per_transaction(engine, SESSION_SETTINGS)
    if with_vector_codec:

        @event.listens_for(engine.sync_engine, "connect")
        def _register_vector(dbapi_connection, _connection_record) -> None:
            dbapi_connection.run_async(register_vector_codec)

    return engine


async def register_vector_codec(driver_connection) -> None:
    # Managed PostgreSQL often installs extensions in their own schema: find the type the
    # way the SQL does, through the search path, instead of assuming ``public``.
    schema = await driver_connection.fetchval(VECTOR_TYPE_SCHEMA)
    if schema is None:
        raise ConfigurationError(VECTOR_TYPE_MISSING)
    await register_vector(driver_connection, schema=schema)


# The schema holding the ``vector`` type the search path resolves (NULL: none visible).
VECTOR_TYPE_SCHEMA = (
    "SELECT n.nspname FROM pg_catalog.pg_type t "
    "JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace "
    "WHERE t.oid = pg_catalog.to_regtype('vector')"
)
VECTOR_TYPE_MISSING = (
    "the pgvector type 'vector' is not on the database search path: install the extension "
    "(CREATE EXTENSION vector) or add its schema to the role's search_path"
)


# A row lock held elsewhere (a core-side transaction, an operator's session) must not stall a
# worker task and its pooled connection forever: waiting past this is a transient error
# (SQLSTATE 55P03) and the stage is left for the rescan (§6).
SESSION_SETTINGS = {
    "lock_timeout": "3s",
    "idle_in_transaction_session_timeout": "60s",
}

# asyncpg waits 60 s for a connection by default; an unreachable host should fail sooner.
CONNECT_TIMEOUT_SECONDS = 10

# Cheapest round trip that proves the database answers.
PING = text("SELECT 1")


def to_array(value: Vector | np.ndarray | None) -> np.ndarray | None:
    """A ``vector`` column value as float32 ``numpy.ndarray`` of shape ``(dimension,)``."""
    if value is None:
        return None
    if isinstance(value, Vector):
        value = value.to_numpy()
    return np.asarray(value, dtype=np.float32)


def is_transient_database_error(exc: BaseException) -> bool:
    """True for driver errors that retrying later may fix (see module docstring)."""
    if isinstance(exc, sa_exc.TimeoutError | OSError | ConnectionError | TimeoutError):
        return True
    if isinstance(exc, sa_exc.DBAPIError):
        if exc.connection_invalidated:
            return True
        state = sqlstate(exc)
        if state is None:
            return isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError)
        return state.startswith(TRANSIENT_SQLSTATE_PREFIXES)
    return False


def sqlstate(exc: BaseException) -> str | None:
    """The PostgreSQL SQLSTATE of a driver error, when it has one."""
    orig = getattr(exc, "orig", None)
    state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return None if state is None else str(state)


@asynccontextmanager
async def _translated() -> AsyncIterator[None]:
    try:
        yield
    except (sa_exc.SQLAlchemyError, OSError, ConnectionError, TimeoutError) as exc:
        if sqlstate(exc) == LOCK_NOT_AVAILABLE:
            raise DatabaseLockTimeout("database lock timeout") from exc
        if is_transient_database_error(exc):
            raise DatabaseUnavailable("database unavailable") from exc
        raise


@asynccontextmanager
async def transaction(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """One short transaction: commits on normal exit, rolls back on any exception.

    Raises ``DatabaseUnavailable`` / ``DatabaseLockTimeout`` (both ``TransientError``) for
    transient driver errors (module docstring).
    """
    async with _translated(), engine.begin() as conn:
        yield conn


@asynccontextmanager
async def autocommit(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection whose every statement commits on its own (claims, plain reads).

    Nothing stays ``idle in transaction`` between statements (FC-03). Through a transaction
    pooler the block is one short explicit transaction instead: only SQL runs inside these
    blocks, and outside a transaction the pooler could split a statement's prepare and
    execute across server connections (``pinlog_schema.connection``).
    """
    if connection.uses_transaction_pooling(engine):
        async with transaction(engine) as conn:
            yield conn
        return
    async with _translated(), engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        yield conn


@asynccontextmanager
async def read_only_snapshot(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """One read-only ``REPEATABLE READ`` transaction: every statement sees the same snapshot
    and none can write (operators' reports). Raises ``TransientError`` like ``transaction``."""
    async with _translated(), engine.connect() as conn:
        conn = await conn.execution_options(
            isolation_level="REPEATABLE READ", postgresql_readonly=True
        )
        async with conn.begin():
            yield conn


async def ping(engine: AsyncEngine) -> bool:
    """True when the database answers a trivial query; never raises."""
    try:
        async with autocommit(engine) as conn:
            await conn.execute(PING)
    except Exception:
        return False
    return True
