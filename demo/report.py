"""The demo's read-back: waits until the worker has finished every live context, then reads
both statuses and the chosen keywords of every context the demo touched, for the table."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from demo import table
from demo.feed import ContextLine

POLL_SECONDS = 0.2
PROGRESS_SECONDS = 2.0
NOTE_WIDTH = 28  # display columns of the note's text in the table

# Contexts among the given ones with a stage still unfinished.
COUNT_UNFINISHED_CONTEXTS = text(
    "SELECT count(*) FROM ai.context_ai_state WHERE context_id = ANY(CAST(:ids AS bigint[])) "
    "AND (embedding_status IN ('PENDING', 'PROCESSING') "
    "OR keyword_status IN ('PENDING', 'PROCESSING'))"
)

# Statuses and chosen keywords (display names, best first) as the owner would read them
# (§9 keyword read rules); a cancelled context shows none even if its rows remain.
LOAD_RESULTS = text(
    """
    SELECT s.context_id, s.embedding_status, s.keyword_status,
           coalesce(array_agg(p.display_name ORDER BY k.confidence DESC, p.id)
                    FILTER (WHERE p.id IS NOT NULL), '{}') AS keywords
    FROM ai.context_ai_state AS s
    LEFT JOIN ai.context_keyword AS k ON k.context_id = s.context_id
        AND s.keyword_status = 'COMPLETED'
    LEFT JOIN ai.keyword_preset AS p ON p.id = k.keyword_id
        AND p.is_active AND p.visibility IN ('PUBLIC', 'PRIVATE_ONLY')
    WHERE s.context_id = ANY(CAST(:ids AS bigint[]))
    GROUP BY s.context_id, s.embedding_status, s.keyword_status
    """
)


@dataclass(frozen=True, slots=True)
class ContextResult:
    context_id: int
    member_id: int
    place: str
    note: str
    fate: str
    embedding_status: str
    keyword_status: str
    keywords: tuple[str, ...]


async def wait_until_finished(
    engine: AsyncEngine,
    context_ids: list[int],
    *,
    limit_seconds: float,
    say: Callable[[str], None] = print,
) -> None:
    """Poll every 0.2 s until no stage of the contexts is unfinished, saying
    ``worker: 40/64 processed`` whenever that count changes (at most every 2 s, and at the
    end); at most ``limit_seconds`` (``TimeoutError`` then)."""
    total, said, said_at = len(context_ids), -1, 0.0
    async with asyncio.timeout(limit_seconds):
        while True:
            async with engine.connect() as conn:
                unfinished = (
                    await conn.execute(COUNT_UNFINISHED_CONTEXTS, {"ids": context_ids})
                ).scalar()
            done = total - unfinished
            now = time.monotonic()
            if done != said and (not unfinished or now - said_at >= PROGRESS_SECONDS):
                say(f"worker: {done}/{total} processed")
                said, said_at = done, now
            if not unfinished:
                return
            await asyncio.sleep(POLL_SECONDS)


async def load_results(engine: AsyncEngine, lines: list[ContextLine]) -> list[ContextResult]:
    """One result per line, in the order of ``lines``."""
    async with engine.connect() as conn:
        rows = await conn.execute(LOAD_RESULTS, {"ids": [line.context_id for line in lines]})
        by_id = {row.context_id: row for row in rows}
    return [
        ContextResult(
            line.context_id,
            line.member_id,
            line.place,
            line.text,
            line.fate,
            by_id[line.context_id].embedding_status,
            by_id[line.context_id].keyword_status,
            tuple(by_id[line.context_id].keywords),
        )
        for line in lines
    ]


def render_results(results: list[ContextResult]) -> str:
    rows = [
        [
            str(r.context_id),
            str(r.member_id),
            r.place,
            table.shorten(r.note, NOTE_WIDTH),
            r.fate,
            r.embedding_status,
            r.keyword_status,
            ", ".join(r.keywords) or "-",
        ]
        for r in results
    ]
    headers = [
        "context", "member", "place", "note", "context is", "embedding", "keyword", "keywords"
    ]  # fmt: skip
    return table.render(headers, rows)
