"""What one poll of the autoscaler's query costs (docs/scaling.md "Autoscaling on the backlog").

Fills ``ai.context_ai_state`` with ``--rows`` state rows (default 1,000,000) of which a
fraction is unfinished (``--fractions``, default 1 % and 10 %: next stage ``PENDING`` or
``PROCESSING``, the rest ``COMPLETED``), and ``ai.context_embedding_backfill`` with as many
rows of the profile, the same fraction open. Then runs ``pinlog_platform.contract.scaler``'s
query as KEDA sends it (``--polls`` times; median and p95 in ms) in three states of the
tables: just filled (no page all-visible yet), after ``VACUUM (ANALYZE)`` (what autovacuum
leaves), and after 1 % of the unfinished rows moved on since that vacuum (workers at work).
Prints the plan's scans, heap fetches and shared buffers of one ``EXPLAIN (ANALYZE, BUFFERS)``,
and, for comparison, the same count without its cap. Asserts nothing.

    python -m bench.scaler_query [--rows 1000000] [--fractions 0.01,0.1] [--polls 200]

Uses ``PINLOG_DATABASE_URL`` (an empty database) when set, else an embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text

from app import embedded_postgres
from app.repository.db import create_engine
from pinlog_platform.contract.scaler import render
from pinlog_platform.contract.schema import runner

PROFILE = "openai-text-embedding-3-small-1536-cosine-v1"
FILL_BATCH = 100_000

EMPTY = text("TRUNCATE ai.context_ai_state, ai.context_embedding_backfill")
# Every ``step``-th row unfinished, spread over the next-stage states the query counts.
FILL_STATES = text(
    """
    INSERT INTO ai.context_ai_state (context_id, embedding_status, keyword_status, updated_at)
    SELECT g,
           CASE WHEN g % :step <> 0 THEN 'COMPLETED'
                WHEN g / :step % 3 = 0 THEN 'PENDING'
                WHEN g / :step % 3 = 1 THEN 'PROCESSING'
                ELSE 'COMPLETED' END,
           CASE WHEN g % :step <> 0 THEN 'COMPLETED'
                WHEN g / :step % 3 = 2 THEN 'PENDING'
                ELSE 'PENDING' END,
           now() - make_interval(secs => g % 86400)
    FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS g
    """
)
FILL_BACKFILL = text(
    """
    INSERT INTO ai.context_embedding_backfill (embedding_profile, context_id, status)
    SELECT :profile, g, CASE WHEN g % :step = 0 THEN 'PENDING' ELSE 'COMPLETED' END
    FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS g
    """
)
# Workers at work: some unfinished rows move on (embedding done), after the vacuum.
MOVE_ON = text(
    """
    UPDATE ai.context_ai_state SET embedding_status = 'COMPLETED', updated_at = now()
    WHERE context_id IN (SELECT context_id FROM ai.context_ai_state
                         WHERE embedding_status IN ('PENDING', 'PROCESSING')
                         LIMIT :n)
    """
)
# The same count without the cap, for comparison only.
UNCAPPED = """
SELECT (SELECT count(*) FROM ai.context_ai_state
        WHERE embedding_status IN ('PENDING', 'PROCESSING')
           OR (embedding_status = 'COMPLETED' AND keyword_status IN ('PENDING', 'PROCESSING')))
     + (SELECT count(*) FROM ai.context_embedding_backfill
        WHERE embedding_profile = '{profile}' AND status IN ('PENDING', 'PROCESSING'))
"""


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found += _nodes(child)
    return found


async def _timed(conn, sql: str, polls: int) -> tuple[float, float, int]:
    times = []
    value = 0
    for _ in range(polls):
        started = time.perf_counter()
        value = (await conn.exec_driver_sql(sql)).scalar_one()
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    return statistics.median(times), times[int(len(times) * 0.95) - 1], int(value)


async def _report(conn, label: str, polls: int) -> None:
    query = render(PROFILE, default_profile=PROFILE)
    median, p95, value = await _timed(conn, query, polls)
    (plan,) = (
        await conn.exec_driver_sql(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {query}")
    ).scalar_one()
    scans = [
        f"{n['Relation Name']}: {n['Node Type']}"
        + (f" {n['Index Name']}" if "Index Name" in n else "")
        + (f", heap fetches {n['Heap Fetches']}" if "Heap Fetches" in n else "")
        for n in _nodes(plan["Plan"])
        if "Relation Name" in n
    ]
    buffers = plan["Plan"].get("Shared Hit Blocks", 0) + plan["Plan"].get("Shared Read Blocks", 0)
    print(f"  {label}: {median:.2f} ms median, {p95:.2f} ms p95, value {value}, "
          f"{buffers} shared buffers")  # fmt: skip
    for scan in scans:
        print(f"      {scan}")


async def run(rows: int, fractions: list[float], polls: int) -> None:
    database_url = os.environ.get("PINLOG_DATABASE_URL") or embedded_postgres.start(
        Path(tempfile.mkdtemp(prefix="pinlog-bench-scaler-")) / "pg", delete_on_exit=True
    )
    engine = create_engine(database_url, pool_size=1, with_vector_codec=False)
    await runner.upgrade(engine)
    for fraction in fractions:
        step = round(1 / fraction)
        started = time.perf_counter()
        async with engine.begin() as conn:
            await conn.execute(EMPTY)
            for first in range(1, rows + 1, FILL_BATCH):
                last = min(first + FILL_BATCH - 1, rows)
                bounds = {"first": first, "last": last, "step": step}
                await conn.execute(FILL_STATES, bounds)
                await conn.execute(FILL_BACKFILL, {**bounds, "profile": PROFILE})
        print(f"{rows} state rows and {rows} backfill rows, {fraction:.1%} unfinished "
              f"(filled in {time.perf_counter() - started:.1f} s)")  # fmt: skip
        async with engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.exec_driver_sql("ANALYZE ai.context_ai_state")
            await conn.exec_driver_sql("ANALYZE ai.context_embedding_backfill")
            await _report(conn, "just filled, analysed, not vacuumed", polls)
            await conn.exec_driver_sql("VACUUM (ANALYZE) ai.context_ai_state")
            await conn.exec_driver_sql("VACUUM (ANALYZE) ai.context_embedding_backfill")
            await _report(conn, "after VACUUM (ANALYZE)", polls)
            await conn.execute(MOVE_ON, {"n": max(1, int(rows * fraction / 100))})
            await _report(conn, "1 % of the unfinished rows moved on since", polls)
            median, p95, value = await _timed(conn, UNCAPPED.format(profile=PROFILE), 20)
            print(f"  without the cap (comparison): {median:.2f} ms median, {p95:.2f} ms p95, "
                  f"value {value}")  # fmt: skip
    await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--fractions", default="0.01,0.1")
    parser.add_argument("--polls", type=int, default=200)
    args = parser.parse_args()
    fractions = [float(part) for part in args.fractions.split(",")]
    asyncio.run(run(args.rows, fractions, args.polls))


if __name__ == "__main__":
    main()
