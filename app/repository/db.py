"""Engine construction, transactions, and driver-error translation at the boundary (§6).

Vectors cross the driver as ``numpy.ndarray`` (pgvector's asyncpg codec, registered per
connection). A lock wait past ``lock_timeout`` becomes ``DatabaseLockTimeout("database lock
timeout")`` (the database is up, a row is busy); connection loss, serialization failures,
timeouts and pool exhaustion become ``DatabaseUnavailable("database unavailable")``; every other
driver error propagates as is (a bug of ours, HTTP 500).
"""

from __future__ import annotations

from functools import partial
from types import MappingProxyType

import numpy as np
from pgvector import Vector
from pgvector.asyncpg import register_vector
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.errors import (
    ConfigurationError,
    DatabaseLockTimeout,
    DatabaseUnavailable,
    InvalidInputError,
)
from pinlog_platform.db import engines, transactions
from pinlog_platform.db.sqlstates import (
    LOCK_NOT_AVAILABLE,
    is_data_exception,
    is_transient,
    sqlstate,
)

# A row lock held elsewhere (a core-side transaction, an operator's session) must not stall a
# worker task and its pooled connection forever: waiting past this is a transient error
# (SQLSTATE 55P03) and the stage is left for the rescan (§6).
SESSION_SETTINGS = MappingProxyType(
    {
        "lock_timeout": "3s",
        "idle_in_transaction_session_timeout": "60s",
    }
)

# asyncpg waits 60 s for a connection by default; an unreachable host should fail sooner.
CONNECT_TIMEOUT_SECONDS = 5

# The deadline of every command (statement, COMMIT) by default; the worker's pools use the
# smaller of this and a quarter of the stage deadline (``command_timeout_for``). On it the
# statement fails as a transient error (§6): cancelled by the server (statement_timeout), or,
# when the server does not answer, its connection terminated
# (pinlog_platform.db.connection.with_command_deadline).
COMMAND_TIMEOUT_SECONDS = 5.0

# Migrations run DDL that may legitimately take longer than a request's budget.
MIGRATION_COMMAND_TIMEOUT_SECONDS: float | None = None

# The worker's engine parameters, all in one place. No pre-ping by default: see create_engine.
ENGINE_PARAMETERS = engines.EngineParameters(
    session_settings=SESSION_SETTINGS,
    pool_timeout_seconds=5,
    pre_ping=False,
    connect_timeout_seconds=CONNECT_TIMEOUT_SECONDS,
    command_timeout_seconds=COMMAND_TIMEOUT_SECONDS,
)


def command_timeout_for(stage_deadline_seconds: float) -> float:
    """The worker's command deadline: ``COMMAND_TIMEOUT_SECONDS``, or a quarter of the stage
    deadline (``app.failure_policy.stage_deadline_seconds``) when that is smaller: a stage's
    statements end well before the stage must. Derived, never a reason to refuse startup."""
    return max(0.1, min(COMMAND_TIMEOUT_SECONDS, stage_deadline_seconds / 4))


def create_engine(
    database_url: str,
    *,
    pool_size: int = 10,
    with_vector_codec: bool = True,
    transaction_pooling: bool = False,
    pre_ping: bool = False,
    command_timeout_seconds: float | None = COMMAND_TIMEOUT_SECONDS,
) -> AsyncEngine:
    """Build the worker's async engine for a ``postgresql+asyncpg://`` URL.

    ``with_vector_codec=False`` is for migrations, which run before the extension exists.
    ``transaction_pooling`` is for PgBouncer in transaction mode
    (``pinlog_platform.db.connection``).
    Connecting raises ``ConfigurationError`` when the ``vector`` type is not on the search path.
    ``pre_ping=True`` pings every connection at checkout (one round trip each): only for
    engines off the hot path (readiness, tooling). Without it a connection that died while
    pooled fails its statement as a transient error (§6), and SQLAlchemy then recycles every
    connection pooled before the failure, so one stage pays for a lost database session.
    ``command_timeout_seconds``: the deadline of every command (``None``: none, migrations).
    """
    engine = engines.create_engine(
        database_url,
        ENGINE_PARAMETERS,
        pool_size=pool_size,
        transaction_pooling=transaction_pooling,
        pre_ping=pre_ping,
        command_timeout_seconds=command_timeout_seconds,
    )
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


# Cheapest round trip that proves the database answers and accepts writes (a standby, or
# default_transaction_read_only after a failover, answers false).
PING = text(engines.ACCEPTS_WRITES)


def to_array(value: Vector | np.ndarray | None) -> np.ndarray | None:
    """A ``vector`` column value as float32 ``numpy.ndarray`` of shape ``(dimension,)``."""
    if value is None:
        return None
    if isinstance(value, Vector):
        value = value.to_numpy()
    return np.asarray(value, dtype=np.float32)


def translate_database_error(exc: BaseException) -> None:
    """The worker's translation of a driver error (§6): a lock wait past ``lock_timeout``
    raises ``DatabaseLockTimeout`` (the database is up, a row is busy); another transient
    error raises ``DatabaseUnavailable``; anything else returns, and the driver error
    propagates (a bug of ours, HTTP 500)."""
    if sqlstate(exc) == LOCK_NOT_AVAILABLE:
        raise DatabaseLockTimeout("database lock timeout") from exc
    if is_transient(exc):
        raise DatabaseUnavailable("database unavailable") from exc


def translate_client_input_error(exc: BaseException) -> None:
    """``translate_database_error`` for a statement bound to a caller's request values (a
    search's member id and limit): a data exception (SQLSTATE class 22) is the request's
    fault, ``InvalidInputError`` (422). Request bodies are validated before any statement;
    this is the backstop."""
    if is_data_exception(exc):
        raise InvalidInputError(f"request value out of range (SQLSTATE {sqlstate(exc)})") from None
    translate_database_error(exc)


# The platform's helpers with the worker's translation (both errors are ``TransientError``).
transaction = partial(transactions.transaction, translate=translate_database_error)
autocommit = partial(transactions.autocommit, translate=translate_database_error)
client_autocommit = partial(transactions.autocommit, translate=translate_client_input_error)
read_only_snapshot = partial(transactions.read_only_snapshot, translate=translate_database_error)


async def ping(engine: AsyncEngine) -> bool:
    """True when the database answers and accepts writes; never raises."""
    try:
        async with autocommit(engine) as conn:
            return bool((await conn.execute(PING)).scalar())
    except Exception:
        return False
