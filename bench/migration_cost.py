"""What migrations 0060 and 0061 cost on a filled database (docs/operations.md "Migration 0060").

Fills ``ai.context_embedding`` (and the state and analysis rows beside it) with ``--rows``
contexts of 1536-d vectors under the schema as it was before 0060, then times each statement
of 0060 on its own inside one transaction that is rolled back (and whether it rewrote the
table: its file node changes), and finally the real upgrade through the runner. Prints
figures; asserts nothing.

    python -m bench.migration_cost [--rows 100000]

Uses ``PINLOG_DATABASE_URL`` (an empty database) when set, else an embedded PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

from sqlalchemy import text

from app import embedded_postgres
from app.repository.db import create_engine
from pinlog_platform.contract.schema import runner

FIRST_NEW = "0060"
FILL_BATCH = 10_000

FILL_CONTEXTS = text(
    """
    WITH ids AS (SELECT generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS id)
    INSERT INTO ai.context_ai_state (context_id, embedding_status, keyword_status)
    SELECT id, 'COMPLETED', 'COMPLETED' FROM ids
    """
)
FILL_VECTORS = text(
    """
    INSERT INTO ai.context_embedding
        (context_id, user_id, record_id, embedding, embedding_profile)
    SELECT id, id % 1000 + 1, id,
           (SELECT array_agg(random()::real) FROM generate_series(1, 1536) WHERE id > 0)::vector,
           'openai-text-embedding-3-small-1536-cosine-v1'
    FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS id
    """
)
FILL_ANALYSES = text(
    """
    INSERT INTO ai.context_keyword_analysis (context_id, preset_version, model_profile)
    SELECT id, 1, 'openai-chat-gpt-4o-mini'
    FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS id
    """
)
FILE_NODE = text("SELECT pg_relation_filenode('ai.context_embedding') AS node")
TABLE_SIZE = text("SELECT pg_total_relation_size('ai.context_embedding') AS bytes")


def _statements(sql: str) -> list[str]:
    """The statements of a migration file (no dollar quoting in 0060)."""
    lines = [line for line in sql.splitlines() if not line.lstrip().startswith("--")]
    return [part.strip() for part in "\n".join(lines).split(";") if part.strip()]


async def run(rows: int) -> None:
    database_url = os.environ.get("PINLOG_DATABASE_URL") or embedded_postgres.start(
        Path(tempfile.mkdtemp(prefix="pinlog-bench-migration-")) / "pg", delete_on_exit=True
    )
    before = Path(tempfile.mkdtemp(prefix="pinlog-migrations-before-"))
    try:
        files = sorted(runner.bundled_directory().glob("*.sql"))
        for path in files:
            if path.name < FIRST_NEW:
                shutil.copy(path, before / path.name)
        engine = create_engine(database_url, pool_size=1, with_vector_codec=False)
        await runner.upgrade(engine, directory=before)
        started = time.perf_counter()
        for first in range(1, rows + 1, FILL_BATCH):
            last = min(first + FILL_BATCH - 1, rows)
            async with engine.begin() as conn:
                for statement in (FILL_CONTEXTS, FILL_VECTORS, FILL_ANALYSES):
                    await conn.execute(statement, {"first": first, "last": last})
        async with engine.begin() as conn:
            await conn.execute(text("ANALYZE ai.context_embedding"))
            size = (await conn.execute(TABLE_SIZE)).scalar_one()
        print(f"filled {rows} contexts in {time.perf_counter() - started:.1f} s; "
              f"ai.context_embedding {size / 2**20:.0f} MiB")  # fmt: skip

        sql = next(p for p in files if p.name.startswith(FIRST_NEW)).read_text(encoding="utf-8")
        async with engine.connect() as conn:
            transaction = await conn.begin()
            for statement in _statements(sql):
                node = (await conn.execute(FILE_NODE)).scalar_one()
                started = time.perf_counter()
                await conn.execute(text(statement))
                seconds = time.perf_counter() - started
                rewritten = (await conn.execute(FILE_NODE)).scalar_one() != node
                first_line = " ".join(statement.split())[:90]
                print(f"{seconds * 1000:9.1f} ms  rewrite={'yes' if rewritten else 'no ':3}  "
                      f"{first_line}")  # fmt: skip
            await transaction.rollback()

        started = time.perf_counter()
        applied = await runner.upgrade(engine)
        seconds = time.perf_counter() - started
        print(f"upgrade {', '.join(applied)}: {seconds * 1000:.0f} ms in one transaction "
              "(the table's exclusive lock is held until its commit)")  # fmt: skip
        await engine.dispose()
    finally:
        shutil.rmtree(before, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    args = parser.parse_args()
    asyncio.run(run(args.rows))


if __name__ == "__main__":
    main()
