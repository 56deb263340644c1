"""Which database errors are transient, for both services (§6).

Transient means a later attempt may succeed without anyone changing anything: connection
exceptions (class 08), serialization failure (40001), deadlock (40P01), lock not available
(55P03), query cancelled by a statement or lock timeout (57014), server shutting down (57P0x),
a write refused by a read-only server (25006: a standby after a failover, or
``default_transaction_read_only``) and insufficient resources (class 53). Pool exhaustion,
socket errors and timeouts are transient too. Everything else is a bug of ours or the
operator's to fix.

A multi-host URL whose hosts all answer but none with the session asked for
(``target_session_attrs=read-write`` while every server is read-only: the moment of a
switchover between the old primary's demotion and the standby's promotion) is transient too
(``no_suitable_host``): no connection was made, nothing ran.

Some of them also say the connection can no longer serve (``discards_connection``): a
connection-level error, a command deadline, 57P0x (the server is going away) and 25006 (the
session sits on a read-only server, and stays there). Every pool of both services throws such
a connection away instead of handing it to the next request.
"""

from __future__ import annotations

from sqlalchemy import exc as sa_exc

TRANSIENT_SQLSTATE_PREFIXES = (
    "08",
    "25006",
    "40001",
    "40P01",
    "55P03",
    "57014",
    "57P0",
    "53",
)
LOCK_NOT_AVAILABLE = "55P03"
# Class 22, data exception: a value PostgreSQL (or the driver, encoding a parameter) cannot hold
# or compute: out of range, an invalid character, a datetime overflow.
DATA_EXCEPTION_CLASS = "22"
READ_ONLY_TRANSACTION = "25006"

# SQLSTATEs after which the session cannot serve: connection exceptions, the server shutting
# down or terminating the backend (57P01..57P05), a read-only server.
DISCARD_SQLSTATE_PREFIXES = ("08", "57P0", READ_ONLY_TRANSACTION)

# What a driver call can raise: SQLAlchemy's wrappers, and raw socket errors and timeouts.
DRIVER_ERRORS: tuple[type[BaseException], ...] = (
    sa_exc.SQLAlchemyError,
    OSError,
    ConnectionError,
    TimeoutError,
)


def sqlstate(exc: BaseException) -> str | None:
    """The PostgreSQL SQLSTATE of a driver error (SQLAlchemy-wrapped or asyncpg's own), or
    ``None`` when it has none (a socket error, a pool timeout)."""
    orig = getattr(exc, "orig", exc)
    state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    return None if state is None else str(state)


def constraint_name(exc: BaseException) -> str | None:
    """The constraint a driver error names (a CHECK or UNIQUE violation), or ``None``."""
    orig = getattr(exc, "orig", exc)
    return getattr(orig, "constraint_name", None) or getattr(
        getattr(orig, "__cause__", None), "constraint_name", None
    )


def is_data_exception(exc: BaseException) -> bool:
    """True for a data exception (SQLSTATE class 22, ``DATA_EXCEPTION_CLASS``), the driver's
    refusal to encode a parameter included (asyncpg reports it as 22000)."""
    state = sqlstate(exc)
    return state is not None and state.startswith(DATA_EXCEPTION_CLASS)


# asyncpg's error when every host of a multi-host URL answered but none had the asked session
# attributes (matched by name: this module does not import the driver).
_NO_SUITABLE_HOST_ERRORS = frozenset({"TargetServerAttributeNotMatched"})


def no_suitable_host(exc: BaseException) -> bool:
    """True when ``exc`` (or the driver error it wraps) says no host of the URL had the
    session attributes asked for (module docstring): no connection was made."""
    orig = getattr(exc, "orig", None) or exc
    return any(
        type(candidate).__name__ in _NO_SUITABLE_HOST_ERRORS
        for candidate in (exc, orig, getattr(orig, "__cause__", None))
    )


def is_transient(exc: BaseException) -> bool:
    """True for driver errors that retrying later may fix (see the module docstring)."""
    if isinstance(exc, sa_exc.TimeoutError | OSError | ConnectionError | TimeoutError):
        return True
    if no_suitable_host(exc):
        return True
    if isinstance(exc, sa_exc.DBAPIError):
        if exc.connection_invalidated:
            return True
        state = sqlstate(exc)
        if state is None:
            return isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError)
        return state.startswith(TRANSIENT_SQLSTATE_PREFIXES)
    return False


def discards_connection(exc: BaseException) -> bool:
    """True when the connection that raised ``exc`` must not be reused (module docstring):
    a socket error, a command deadline, a closed connection, or a SQLSTATE of
    ``DISCARD_SQLSTATE_PREFIXES``. Works on SQLAlchemy's wrappers and on asyncpg's errors."""
    if no_suitable_host(exc):
        return True
    orig = getattr(exc, "orig", None) or exc
    for candidate in (exc, orig, getattr(orig, "__cause__", None)):
        if isinstance(candidate, OSError | ConnectionError | TimeoutError):
            return True
        state = getattr(candidate, "sqlstate", None)
        if state is not None and str(state).startswith(DISCARD_SQLSTATE_PREFIXES):
            return True
        if type(candidate).__name__ in _CLOSED_CONNECTION_ERRORS:
            return True
    return isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated


# asyncpg's errors for a connection that is closed or was lost mid-command (matched by name:
# this module does not import the driver).
_CLOSED_CONNECTION_ERRORS = frozenset({"ConnectionDoesNotExistError", "ConnectionFailureError"})


def worth_one_retry(exc: BaseException) -> bool:
    """True when ``exc`` (or the driver error it was raised from) says the connection could
    not serve and the statement changed nothing: a connection-level error, 57P0x or 25006.
    A command deadline is not: its budget is spent. For read-only or idempotent statements
    (searches, reads); a transaction whose commit may have happened is never retried."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, TimeoutError | sa_exc.TimeoutError):
            return False
        if discards_connection(seen):
            return True
        seen = seen.__cause__
    return False


# asyncpg's error for a command on a connection it already knows is closed (the server ended
# the session while it was pooled): raised before anything is sent.
_ALREADY_CLOSED_MESSAGE = "connection is closed"


def refused_before_running(exc: BaseException) -> bool:
    """True when ``exc`` proves the statement did not run, so running it again cannot apply it
    twice: the server refused it (25006, a write on a read-only server; 57P0x, the session
    ended, which aborts its transaction), or the driver refused to send it on a connection the
    server had already closed. A connection lost while the statement was in flight is not:
    it may have committed. No host with the session asked for (``no_suitable_host``) is
    refused before running too. For statements that are their own transaction (a create)."""
    if no_suitable_host(exc):
        return True
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = getattr(seen, "orig", None) or seen.__cause__
    for error in chain:
        if isinstance(error, TimeoutError | sa_exc.TimeoutError):
            return False
        state = getattr(error, "sqlstate", None)
        if state is not None and str(state).startswith(("57P0", READ_ONLY_TRANSACTION)):
            return True
        if type(error).__name__ == "InterfaceError" and _ALREADY_CLOSED_MESSAGE in str(error):
            return True
    return False
