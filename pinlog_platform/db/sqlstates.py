"""Which database errors are transient, for both services (§6).

Transient means a later attempt may succeed without anyone changing anything: connection
exceptions (class 08), serialization failure (40001), deadlock (40P01), lock not available
(55P03), query cancelled by a statement or lock timeout (57014), server shutting down (57P0x)
and insufficient resources (class 53). Pool exhaustion, socket errors and timeouts are
transient too. Everything else is a bug of ours or the operator's to fix.
"""

from __future__ import annotations

from sqlalchemy import exc as sa_exc

TRANSIENT_SQLSTATE_PREFIXES = ("08", "40001", "40P01", "55P03", "57014", "57P0", "53")
LOCK_NOT_AVAILABLE = "55P03"

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


def is_transient(exc: BaseException) -> bool:
    """True for driver errors that retrying later may fix (see the module docstring)."""
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
