"""The project's one database-backed token bucket, schema-agnostic.

A bucket is a row ``(bucket_key, tokens, refilled_at, granted)`` of a table whose name comes
from ``BUCKET_TABLES`` (a whitelist: each statement is built once, at import time, and can be
read in full): the core's member quotas in ``core.rate_bucket``; a provider budget of the
worker would add an ``ai.*`` table its role may write (the worker never touches ``core.*``,
§0), taking several tokens at once as a lease (``tokens`` > 1) so that a process writes at most
about once a second.

``take`` is one statement: refill by the elapsed time on the database clock (every replica
shares it), then take ``tokens`` if that many are there. It runs in its own short transaction,
before and never inside the request's own (docs/lock-order.md: the bucket row is locked alone).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

BUCKET_TABLES = ("core.rate_bucket",)

_TAKE = """
    WITH args AS (
        SELECT CAST(:rate AS double precision) AS rate,
               CAST(:capacity AS double precision) AS capacity,
               CAST(:tokens AS double precision) AS wanted
    )
    INSERT INTO {table} AS b (bucket_key, tokens, refilled_at, granted)
    SELECT :bucket_key, capacity - wanted, now(), true FROM args
    ON CONFLICT (bucket_key) DO UPDATE SET
        tokens = (SELECT CASE WHEN f.level >= f.wanted THEN f.level - f.wanted ELSE f.level END
                  FROM (SELECT least(a.capacity, b.tokens + a.rate
                               * extract(epoch FROM now() - b.refilled_at)::double precision)
                               AS level, a.wanted
                        FROM args AS a) AS f),
        granted = (SELECT least(a.capacity, b.tokens + a.rate
                          * extract(epoch FROM now() - b.refilled_at)::double precision)
                          >= a.wanted
                   FROM args AS a),
        refilled_at = now()
    RETURNING granted, tokens
"""
# One statement per whitelisted table, built once.
TAKE_TOKENS = {table: text(_TAKE.format(table=table)) for table in BUCKET_TABLES}


@dataclass(frozen=True, slots=True)
class Take:
    """``granted``: the tokens were taken. ``retry_after_seconds``: when enough will be there
    (whole seconds, at least 1) when not granted, else 0."""

    granted: bool
    retry_after_seconds: int


async def take(
    conn: AsyncConnection,
    *,
    table: str,
    bucket_key: str,
    rate_per_second: float,
    capacity: float,
    tokens: float = 1,
) -> Take:
    """Refill the bucket ``bucket_key`` of ``table`` at ``rate_per_second`` up to ``capacity``
    and take ``tokens`` when that many are there; a new bucket starts full."""
    row = (
        await conn.execute(
            TAKE_TOKENS[table],
            {
                "bucket_key": bucket_key,
                "rate": float(rate_per_second),
                "capacity": float(capacity),
                "tokens": float(tokens),
            },
        )
    ).one()
    if row.granted:
        return Take(True, 0)
    missing = float(tokens) - float(row.tokens)
    return Take(False, max(1, math.ceil(missing / rate_per_second)))
