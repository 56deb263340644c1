"""The SQLAlchemy engine both services build, from one description of its parameters.

Each service lists its own ``EngineParameters`` in one place (its ``repository/db.py``): the
session settings (lock timeout and the like), pool timeout, pre-ping and connect timeout differ
because the services do different work; how an engine is put together does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from pinlog_platform.db import connection


@dataclass(frozen=True)
class EngineParameters:
    """What differs between the services' engines.

    ``session_settings`` maps PostgreSQL parameters to values (``{"lock_timeout": "3s"}``),
    sent at connect time, or ``SET LOCAL`` per transaction through a pooler.
    ``pool_timeout_seconds``: wait for a pooled connection before a transient error.
    ``pre_ping``: one ``SELECT 1`` round trip per checkout (only off the hot path).
    ``connect_timeout_seconds``: asyncpg's connect deadline (its default is 60 s).
    """

    session_settings: MappingProxyType[str, str]
    pool_timeout_seconds: float
    pre_ping: bool
    connect_timeout_seconds: float


def create_engine(
    database_url: str,
    parameters: EngineParameters,
    *,
    pool_size: int = 10,
    transaction_pooling: bool = False,
    pre_ping: bool | None = None,
) -> AsyncEngine:
    """The async engine for a ``postgresql+asyncpg://`` URL.

    ``transaction_pooling`` is for PgBouncer in transaction mode (``pinlog_platform.db.
    connection``); ``pre_ping`` overrides ``parameters.pre_ping`` for one engine. SQL
    parameters (note bodies, vectors) never appear in exception text (§6).
    """
    settings = dict(parameters.session_settings)
    connect_args: dict[str, Any] = {
        **connection.connect_args(settings, transaction_pooling=transaction_pooling),
        "timeout": parameters.connect_timeout_seconds,
    }
    engine = create_async_engine(
        database_url,
        pool_size=pool_size,
        max_overflow=0,
        pool_pre_ping=parameters.pre_ping if pre_ping is None else pre_ping,
        pool_timeout=parameters.pool_timeout_seconds,
        hide_parameters=True,
        connect_args=connect_args,
    )
    if transaction_pooling:
        connection.apply_per_transaction(engine, settings)
    return engine
