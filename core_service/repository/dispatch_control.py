"""``core.dispatch_control``: the one row saying whether dispatching is paused (no row: running).

``pinlog-core pause`` and ``resume`` write it; every core process reads it (docs/operations.md
"Pause").
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

# Whether dispatching is paused; false without a row (an expression, also read by the status).
PAUSED_SQL = "coalesce((SELECT paused FROM core.dispatch_control), false)"
READ_PAUSED = text("SELECT " + PAUSED_SQL)

# Pause or resume (idempotent); the state after the write.
SET_PAUSED = text(
    """
    INSERT INTO core.dispatch_control (singleton, paused, changed_at)
    VALUES (true, :paused, now())
    ON CONFLICT (singleton) DO UPDATE
        SET paused = EXCLUDED.paused,
            changed_at = CASE WHEN core.dispatch_control.paused = EXCLUDED.paused
                              THEN core.dispatch_control.changed_at ELSE now() END
    RETURNING paused
    """
)


async def read_paused(conn: AsyncConnection) -> bool:
    return bool((await conn.execute(READ_PAUSED)).scalar_one())


async def set_paused(conn: AsyncConnection, *, paused: bool) -> bool:
    """Write the pause state; returns it as stored."""
    return bool((await conn.execute(SET_PAUSED, {"paused": paused})).scalar_one())
