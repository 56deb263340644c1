"""The core service's engine and its translation of driver errors at the boundary (§6).

Every session runs with a ``lock_timeout``: a row held by a worker's save or another user
request makes a user request wait at most that long, then answer 503, instead of hanging.
Transient driver errors (``pinlog_platform.db.sqlstates``) become ``UnavailableError`` (503);
the body CHECK becomes ``InvalidBodyError`` (422); any other driver error becomes
``DatabaseFault`` (500, logged at ERROR by ``main.py``) naming only its SQLSTATE, never the
driver's message, which can quote the failing row (a member's note) into logs.

The ``client_*`` helpers are for statements bound to a client's input (the client API's
reads and writes): there a data exception (SQLSTATE class 22: a value out of range, a time
PostgreSQL cannot hold) is the input's fault and becomes ``InvalidInputError`` (422). Input is
validated before it reaches a statement (``pinlog_platform.contract.canonical_ids``, the cursor
and body checks); this is the backstop. Anywhere else a data exception is a bug of ours: 500.
"""

from __future__ import annotations

from functools import partial
from types import MappingProxyType

from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.errors import (
    DatabaseFault,
    InvalidBodyError,
    InvalidInputError,
    UnavailableError,
)
from pinlog_platform.db import engines, transactions
from pinlog_platform.db.sqlstates import (
    constraint_name,
    is_data_exception,
    is_transient,
    sqlstate,
)

SESSION_SETTINGS = MappingProxyType(
    {
        "lock_timeout": "5s",
        "idle_in_transaction_session_timeout": "60s",
        "application_name": "pinlog-core",
    }
)

# The core's engine parameters, all in one place: a user request waits at most 5 s for a
# pooled connection, 5 s to connect and 5 s for each command (COMMIT included). No checkout
# round trip on the request path: a connection the server closed while it was pooled is
# replaced at checkout for free, and a write refused on it or on a read-only server runs once
# more on a fresh connection (``single_statement``); only /readyz's engine pings
# (pinlog_platform.db.engines). The request deadline (CoreSettings.request_timeout_seconds,
# 10 s) bounds the whole request (docs/deployment.md, "Deadlines").
COMMAND_TIMEOUT_SECONDS = 5.0
ENGINE_PARAMETERS = engines.EngineParameters(
    session_settings=SESSION_SETTINGS,
    pool_timeout_seconds=5,
    pre_ping=False,
    connect_timeout_seconds=5,
    command_timeout_seconds=COMMAND_TIMEOUT_SECONDS,
)


def command_timeout_for(request_timeout_seconds: float) -> float:
    """The service's command deadline: ``COMMAND_TIMEOUT_SECONDS``, or half the request
    deadline when that is smaller, so that a statement that hits it still answers (503) within
    the request's budget. Derived, never a reason to refuse startup."""
    return max(0.1, min(COMMAND_TIMEOUT_SECONDS, request_timeout_seconds / 2))


# The CHECK that guards stored note bodies
# (pinlog_platform/contract/schema/sql/0007_core_context_body_check.sql).
BODY_CONSTRAINT = "context_body_normalised"


def create_engine(
    database_url: str,
    *,
    pool_size: int = 10,
    transaction_pooling: bool = False,
    pre_ping: bool = False,
    command_timeout_seconds: float | None = COMMAND_TIMEOUT_SECONDS,
) -> AsyncEngine:
    """The core's async engine for a ``postgresql+asyncpg://`` URL (``ENGINE_PARAMETERS``).
    ``transaction_pooling`` is for PgBouncer in transaction mode: no startup parameters but
    ``application_name``, timeouts by ``SET LOCAL`` per transaction, no prepared-statement
    reuse (``pinlog_platform.db.connection``). ``pre_ping``: one round trip per reused
    checkout that also refuses a read-only session (readiness only, never the request pool).
    ``command_timeout_seconds=None`` is for migrations (DDL may take longer than a
    request)."""
    return engines.create_engine(
        database_url,
        ENGINE_PARAMETERS,
        pool_size=pool_size,
        transaction_pooling=transaction_pooling,
        pre_ping=pre_ping,
        command_timeout_seconds=command_timeout_seconds,
    )


def translate_database_error(exc: BaseException) -> None:
    """The core's translation of a driver error (module docstring); always raises."""
    if is_transient(exc):
        raise UnavailableError("database unavailable") from exc
    constraint = constraint_name(exc)
    if constraint == BODY_CONSTRAINT:
        raise InvalidBodyError("body cannot be stored", loc=("body", "body")) from None
    state = sqlstate(exc) or "unknown"
    raise DatabaseFault(
        f"database error {state}" + (f" on {constraint}" if constraint else "")
    ) from None


def translate_client_input_error(exc: BaseException) -> None:
    """``translate_database_error`` for statements bound to a client's input: a data exception
    is ``InvalidInputError`` (422; module docstring). Always raises."""
    if is_data_exception(exc):
        raise InvalidInputError(f"input out of range (SQLSTATE {sqlstate(exc)})") from None
    translate_database_error(exc)


# The platform's helpers with the core's translation.
transaction = partial(transactions.transaction, translate=translate_database_error)
autocommit = partial(transactions.autocommit, translate=translate_database_error)
single_statement = partial(transactions.single_statement, translate=translate_database_error)
# The same for statements bound to a client's input (module docstring).
client_transaction = partial(transactions.transaction, translate=translate_client_input_error)
client_autocommit = partial(transactions.autocommit, translate=translate_client_input_error)
client_single_statement = partial(
    transactions.single_statement, translate=translate_client_input_error
)
# One read-only REPEATABLE READ snapshot for a client's multi-statement read (the export).
client_read_only_snapshot = partial(
    transactions.read_only_snapshot, translate=translate_client_input_error
)
