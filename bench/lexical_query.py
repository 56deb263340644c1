"""Benchmark: the core's search-lists statement (lexical BM25 and name matches,
``core_service.repository.context_search.SEARCH_LISTS``) for a member with many notes.

Embedded PostgreSQL (or ``PINLOG_CORE_DATABASE_URL``), every migration; ``--notes`` notes of
member 1 (the development notes of ``bench/search_eval/notes.yaml`` repeated, each with its real
terms) beside as many of member 2; then each labelled query of member 1 run ``--rounds`` times.
Prints the statement's latency percentiles and the analyser's cost per note. Asserts nothing.

    .venv/bin/python -m bench.lexical_query --notes 10000
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import yaml
from sqlalchemy import text

from app import embedded_postgres
from core_service.repository import context_search
from core_service.repository.db import autocommit, create_engine, transaction
from pinlog_platform.contract import schema as migrations
from pinlog_platform.contract.search.terms import ANALYSER_VERSION, analyse, query_terms
from pinlog_platform.korean_lemmas import shared_analyser

EVAL = Path(__file__).with_name("search_eval")
SEED_RECORDS = text(
    """
    WITH place AS (
        INSERT INTO core.place (external_place_id, name)
        SELECT 'bench-' || m || '-' || g, 'p' FROM generate_series(1, :records) AS g,
               (VALUES (1), (2)) AS v(m)
        RETURNING id, external_place_id
    )
    INSERT INTO core.record (member_id, place_id, place_name)
    SELECT split_part(external_place_id, '-', 2)::bigint, id, 'p' FROM place
    """
)
MEMBERS = text("INSERT INTO core.member (id) VALUES (1), (2) ON CONFLICT DO NOTHING")
RECORDS_OF = text("SELECT id FROM core.record WHERE member_id = :m ORDER BY id")
INSERT_CONTEXT = text(
    """
    INSERT INTO core.context (record_id, member_id, body, origin_created_at)
    SELECT unnest(CAST(:records AS bigint[])), :m, unnest(CAST(:bodies AS text[])), now()
    RETURNING id
    """
)


async def run(notes: int, rounds: int) -> None:
    database_url = os.environ.get("PINLOG_CORE_DATABASE_URL") or embedded_postgres.start(
        Path(tempfile.mkdtemp(prefix="pinlog-bench-lexical-")) / "pg", delete_on_exit=True
    )
    engine = create_engine(database_url, pool_size=2)
    await migrations.upgrade(engine)
    texts = [n["text"] for n in yaml.safe_load((EVAL / "notes.yaml").read_text())["notes"]]
    queries = [
        q["query"]
        for q in yaml.safe_load((EVAL / "member_queries.yaml").read_text())["queries"]
        if q["member"] == 1
    ]
    shared_analyser().load()
    for note in texts:  # the analyser's first calls warm its caches
        analyse(note)
    started = time.process_time()
    analysed = [analyse(t) for t in texts]
    per_note_ms = (time.process_time() - started) / len(texts) * 1000
    records = max(1, notes // 3)
    async with transaction(engine) as conn:
        await conn.execute(MEMBERS)
        await conn.execute(SEED_RECORDS, {"records": records})
    for member_id in (1, 2):
        async with transaction(engine) as conn:
            record_ids = [r[0] for r in await conn.execute(RECORDS_OF, {"m": member_id})]
            bodies = [texts[i % len(texts)] for i in range(notes)]
            ids = [
                r[0]
                for r in await conn.execute(
                    INSERT_CONTEXT,
                    {
                        "m": member_id,
                        "records": [record_ids[i % len(record_ids)] for i in range(notes)],
                        "bodies": bodies,
                    },
                )
            ]
            for start in range(0, notes, 500):
                chunk = {
                    ids[i]: analysed[i % len(texts)] for i in range(start, min(notes, start + 500))
                }
                await context_search.replace_terms(
                    conn, terms=chunk, analyser_version=ANALYSER_VERSION
                )
        async with autocommit(engine) as conn:
            await conn.execute(text("ANALYZE"))
    timings = []
    for _ in range(rounds):
        for query in queries:
            terms = query_terms(query)
            began = time.perf_counter()
            async with autocommit(engine) as conn:
                await context_search.search_lists(
                    conn, member_id=1, terms=terms, named_ids=[], floor_share=0.95, limit=20
                )
            timings.append((time.perf_counter() - began) * 1000)
    timings.sort()
    print(
        f"member with {notes} notes (and another with {notes}): search-lists statement over "
        f"{len(timings)} queries: p50 {statistics.median(timings):.1f} ms, "
        f"p99 {timings[int(len(timings) * 0.99) - 1]:.1f} ms; analyser "
        f"{per_note_ms:.2f} ms CPU per note"
    )
    await engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notes", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(run(args.notes, args.rounds))


if __name__ == "__main__":
    main()
