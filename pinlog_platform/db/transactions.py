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
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from pinlog_platform.db import connection
from pinlog_platform.db.sqlstates import DRIVER_ERRORS, discards_connection
from pinlog_platform.http import request_deadline

logger = logging.getLogger(__name__)

Translate = Callable[[BaseException], None]


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

    From ``COMMIT`` on, the request's deadline no longer fires (``pinlog_platform.http.
    request_deadline``); ``COMMIT`` is bounded by the command deadline. A commit that fails on
    a connection that can no longer serve (lost, past its deadline) may or may not have
    happened: it is logged and counted, and answers as any transient error (503); a client's
    retry may then create a second context (docs/core-service.md).
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
        with request_deadline.committing():
            try:
                await trans.commit()
            except DRIVER_ERRORS as exc:
                if discards_connection(exc):
                    logger.warning("commit outcome unknown: %s", type(exc).__name__)
                    request_deadline.commit_outcome_unknown()
                raise


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
