"""Transactions and autocommit connections of both services, with each service's translation
of driver errors at the boundary (§6).

The services translate with different rules (the worker tells a lock timeout from an outage and
lets other errors propagate; the core maps its body CHECK to 422 and hides every other driver
message), so every helper takes a ``translate`` callable: it is called inside the ``except``
block with the driver error and either raises the service's own error or returns, in which case
the driver error propagates unchanged.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from pinlog_platform.db import commit_watch, connection
from pinlog_platform.db.sqlstates import DRIVER_ERRORS, discards_connection, refused_before_running

logger = logging.getLogger(__name__)

Translate = Callable[[BaseException], None]
T = TypeVar("T")


@asynccontextmanager
async def translated(translate: Translate) -> AsyncIterator[None]:
    """Driver errors raised inside the block go through ``translate`` (module docstring)."""
    try:
        yield
    except DRIVER_ERRORS as exc:
        translate(exc)
        raise


@asynccontextmanager
async def transaction(
    engine: AsyncEngine, *, translate: Translate
) -> AsyncIterator[AsyncConnection]:
    """One short transaction: commits on normal exit, rolls back on any exception; driver
    errors go through ``translate``.

    From ``COMMIT`` on, the request's deadline no longer fires (``commit_watch``); ``COMMIT``
    is bounded by the command deadline. A commit that fails on a connection that can no longer
    serve (lost, past its deadline) may or may not have happened: it is logged and counted, and
    answers as any transient error (503); a client's retry may then create a second context
    (docs/core-service.md).
    """
    async with translated(translate), engine.connect() as conn:
        trans = await conn.begin()
        try:
            yield conn
        except BaseException:
            if trans.is_active:
                # The block's own error is the one to report, not a failed rollback's.
                with contextlib.suppress(*DRIVER_ERRORS):
                    await trans.rollback()
            raise
        with commit_watch.committing():
            try:
                await trans.commit()
            except DRIVER_ERRORS as exc:
                if discards_connection(exc):
                    logger.warning("commit outcome unknown: %s", type(exc).__name__)
                    commit_watch.commit_outcome_unknown()
                setattr(exc, _DURING_COMMIT, True)
                raise


# Set on a driver error raised by COMMIT: whatever it says, the transaction may have committed.
_DURING_COMMIT = "pinlog_during_commit"


@asynccontextmanager
async def autocommit(
    engine: AsyncEngine, *, translate: Translate
) -> AsyncIterator[AsyncConnection]:
    """A connection whose every statement commits on its own (claims, plain reads).

    Nothing stays ``idle in transaction`` between statements (FC-03). Through a transaction
    pooler the block is one short explicit transaction instead: only SQL runs inside these
    blocks, and outside a transaction the pooler could split a statement's prepare and execute
    across server connections (``pinlog_platform.db.connection``).
    """
    if connection.uses_transaction_pooling(engine):
        async with transaction(engine, translate=translate) as conn:
            yield conn
        return
    async with translated(translate), engine.connect() as conn:
        conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
        yield conn


@asynccontextmanager
async def read_only_snapshot(
    engine: AsyncEngine, *, translate: Translate
) -> AsyncIterator[AsyncConnection]:
    """One read-only ``REPEATABLE READ`` transaction: every statement sees the same snapshot
    and none can write (operators' reports)."""
    async with translated(translate), engine.connect() as conn:
        conn = await conn.execution_options(
            isolation_level="REPEATABLE READ", postgresql_readonly=True
        )
        async with conn.begin():
            yield conn


async def single_statement(
    engine: AsyncEngine,
    run: Callable[[AsyncConnection], Awaitable[T]],
    *,
    translate: Translate,
) -> T:
    """``run`` one data-modifying statement in a short transaction of its own: ``BEGIN``,
    the statement, ``COMMIT`` (three round trips), so nothing is half-written, and a statement
    whose delivery was delayed past the client's deadline never commits on its own (the server
    rolls back a transaction whose client is gone).

    Run once more on a fresh connection when the statement was refused before it ran
    (``sqlstates.refused_before_running``: a connection the server closed while it was
    pooled, a read-only server, a session ended), since SQLAlchemy has then replaced every
    connection pooled before the error: this is what spares the pool a checkout round trip.
    ``COMMIT`` is never retried (its outcome may be unknown: ``transaction``). Driver errors
    go through ``translate``.
    """
    try:
        async with transaction(engine, translate=_propagate) as conn:
            return await run(conn)
    except DRIVER_ERRORS as exc:
        if getattr(exc, _DURING_COMMIT, False) or not refused_before_running(exc):
            translate(exc)
            raise
        logger.info("statement refused before it ran (%s); once more", type(exc).__name__)
    async with transaction(engine, translate=translate) as conn:
        return await run(conn)


def _propagate(_exc: BaseException) -> None:
    """A ``Translate`` that lets the driver error through (the caller decides)."""
