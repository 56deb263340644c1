"""Keyword quality of embedder/judge pairs on the labelled notes, through the real pipeline.

Embedded PostgreSQL (or ``PINLOG_DATABASE_URL``) -> migrations -> presets embedded with the
pair's profile -> the worker served over HTTP -> every note created as the core side does
(``PENDING`` state committed, then the POST) -> keywords read back as their owner would (§9)
-> micro precision, recall and F1 over (note, preset) pairs, plus:

- ``missed``: share of notes expecting keywords that got none;
- ``spurious``: share of notes expecting none that got some;
- ``hidden``: keyword rows pointing at BLOCKED or retired presets (must be 0, §4).

Parts (``bench/keyword_eval/<part>.yaml``): ``dev`` and ``dev_reader`` (development),
``test`` (the first test part, looked at twice), ``test_reader`` (the first reader test, seen
since judge r3's evaluation), ``test_reader2`` (the frozen reader test of judge r4) and ``demo``
(the demo's notes, a check set); ``both`` means ``dev test``. ``--per-preset`` adds
each preset's positives, predictions, precision and recall.

    .venv/bin/python -m bench.keyword_quality --part test_reader demo --per-preset
    .venv/bin/python -m bench.keyword_quality   # every part
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn
import yaml
from sqlalchemy import text

from app import embedded_postgres
from app.main import create_app
from app.providers.factory import build_embedding_provider
from app.repository.db import create_engine
from app.service.preset_loader import load_presets, read_preset_file
from app.settings import OFFLINE_EMBEDDING_MODEL, OFFLINE_PROFILE, DatabaseSettings, Settings
from bench import state_rows
from pinlog_platform.contract import schema as migrations

PARTS = Path(__file__).with_name("keyword_eval")
PART_NAMES = ("dev", "dev_reader", "test", "test_reader", "test_reader2", "demo")
PROCESS_PATH = "/internal/v1/context/process"

# The pairs compared: the former offline default and the PINLOG_OFFLINE one.
PAIRS: dict[str, dict[str, object]] = {
    "hashing+similarity": {
        "embedding_provider": "hashing",
        "embedding_model": OFFLINE_EMBEDDING_MODEL,
        "embedding_profile": OFFLINE_PROFILE,
        "judge_provider": "similarity",
        "keyword_similarity_floor": 0.12,
        "judge_similarity_threshold": 0.15,
    },
    "use-multilingual+learned": {"offline": True},
}

# Codes the owner would read (§9 keyword read rules), one row per chosen keyword.
OWNER_CODES = text(
    """
    SELECT k.context_id, p.code
    FROM ai.context_keyword AS k
    JOIN ai.context_ai_state AS s ON s.context_id = k.context_id
    JOIN ai.keyword_preset AS p ON p.id = k.keyword_id
    WHERE k.context_id = ANY(CAST(:ids AS bigint[])) AND s.keyword_status = 'COMPLETED'
      AND p.is_active AND p.visibility IN ('PUBLIC', 'PRIVATE_ONLY')
    """
)

# Keyword rows of these contexts that point at presets nobody may see (must be none).
HIDDEN_ROWS = text(
    """
    SELECT count(*) FROM ai.context_keyword AS k JOIN ai.keyword_preset AS p ON p.id = k.keyword_id
    WHERE k.context_id = ANY(CAST(:ids AS bigint[]))
      AND (NOT p.is_active OR p.visibility = 'BLOCKED')
    """
)


@dataclass(frozen=True, slots=True)
class Scores:
    precision: float
    recall: float
    f1: float
    missed: float
    spurious: float
    hidden: int
    notes: int
    # code -> (true positives, false positives, false negatives)
    per_preset: dict[str, tuple[int, int, int]]


def load_part(part: str) -> list[dict]:
    """Notes of ``part`` (one of ``PART_NAMES``): ``[{"text": str, "labels": [code, ...]}]``."""
    return yaml.safe_load((PARTS / f"{part}.yaml").read_text(encoding="utf-8"))["notes"]


def score(gold: list[set[str]], predicted: list[set[str]], hidden: int) -> Scores:
    """Micro scores over (note, code) pairs; shares are 0..1."""
    tp = sum(len(g & p) for g, p in zip(gold, predicted, strict=True))
    fp = sum(len(p - g) for g, p in zip(gold, predicted, strict=True))
    fn = sum(len(g - p) for g, p in zip(gold, predicted, strict=True))
    precision = tp / max(tp + fp, 1)
    recall = tp / max(tp + fn, 1)
    f1 = 2 * precision * recall / max(precision + recall, 1e-9)
    expecting = [p for g, p in zip(gold, predicted, strict=True) if g]
    expecting_none = [p for g, p in zip(gold, predicted, strict=True) if not g]
    missed = sum(not p for p in expecting) / max(len(expecting), 1)
    spurious = sum(bool(p) for p in expecting_none) / max(len(expecting_none), 1)
    codes = sorted(set().union(*gold, *predicted))
    per_preset = {
        code: (
            sum(code in g and code in p for g, p in zip(gold, predicted, strict=True)),
            sum(code not in g and code in p for g, p in zip(gold, predicted, strict=True)),
            sum(code in g and code not in p for g, p in zip(gold, predicted, strict=True)),
        )
        for code in codes
    }
    return Scores(precision, recall, f1, missed, spurious, hidden, len(gold), per_preset)


async def evaluate(settings: Settings, notes: list[dict]) -> Scores:
    """Run ``notes`` through a worker built from ``settings`` and score its keywords."""
    engine = create_engine(settings.database_url, with_vector_codec=False)
    try:
        await migrations.upgrade(engine)  # core too: context ids come from its sequence
    finally:
        await engine.dispose()
    engine = create_engine(settings.database_url, pool_size=2)
    embedder = build_embedding_provider(settings)
    try:
        await load_presets(engine, embedder, read_preset_file(), settings.embedding_profile)
    finally:
        await embedder.aclose()
    app = create_app(settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if serving.done():
                await serving
                raise RuntimeError("worker did not start")
            await asyncio.sleep(0.05)
        port = server.servers[0].sockets[0].getsockname()[1]
        ids = await _feed(engine, settings, f"http://127.0.0.1:{port}", notes)
        async with engine.connect() as conn:
            rows = (await conn.execute(OWNER_CODES, {"ids": ids})).all()
            hidden = int((await conn.execute(HIDDEN_ROWS, {"ids": ids})).scalar_one())
    finally:
        server.should_exit = True
        await serving
        await engine.dispose()
    chosen: dict[int, set[str]] = {context_id: set() for context_id in ids}
    for row in rows:
        chosen[row.context_id].add(row.code)
    gold = [set(note["labels"]) for note in notes]
    return score(gold, [chosen[context_id] for context_id in ids], hidden)


def _unfinished(statuses: dict[int, str]) -> bool:
    return any(status in ("PENDING", "PROCESSING") for status in statuses.values())


async def _feed(engine, settings: Settings, base_url: str, notes: list[dict]) -> list[int]:
    headers = {"X-Internal-Secret": settings.internal_secret.get_secret_value()}
    ids = await state_rows.reserve_context_ids(engine, len(notes))
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as client:
        for context_id, note in zip(ids, notes, strict=True):
            await state_rows.create_pending_state(engine, context_id)
            body = {"contextId": context_id, "userId": 1, "recordId": context_id}
            response = await client.post(PROCESS_PATH, json={**body, "text": note["text"]})
            response.raise_for_status()
    async with asyncio.timeout(600):
        while _unfinished(await state_rows.keyword_statuses(engine, ids)):  # noqa: ASYNC110
            await asyncio.sleep(0.2)  # polls the database: the worker runs in another process
    return ids


async def run(parts: list[str]) -> list[tuple[str, str, Scores]]:
    database_url = DatabaseSettings().database_url or embedded_postgres.start(
        Path(tempfile.mkdtemp(prefix="pinlog-eval-")) / "pg", delete_on_exit=True
    )
    secret = secrets.token_urlsafe(24)
    results = []
    for pair, values in PAIRS.items():
        settings = Settings(database_url=database_url, internal_secret=secret, **values)
        for part in parts:
            results.append((pair, part, await evaluate(settings, load_part(part))))
    return results


def render(results: list[tuple[str, str, Scores]]) -> str:
    """A Markdown table, one row per pair and part."""
    lines = [
        "| pair | part | notes | precision | recall | F1 | missed | spurious | hidden |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for pair, part, s in results:
        lines.append(
            f"| {pair} | {part} | {s.notes} | {s.precision:.3f} | {s.recall:.3f} | {s.f1:.3f} "
            f"| {s.missed:.1%} | {s.spurious:.1%} | {s.hidden} |"
        )
    return "\n".join(lines)


def render_per_preset(results: list[tuple[str, str, Scores]]) -> str:
    """One Markdown table per pair and part: each preset's positives (gold), predictions,
    true positives, precision and recall ("-" when undefined)."""
    blocks = []
    for pair, part, s in results:
        lines = [
            f"{pair}, {part}:",
            "",
            "| preset | positives | predicted | correct | precision | recall |",
            "|---|---|---|---|---|---|",
        ]
        for code, (tp, fp, fn) in s.per_preset.items():
            precision = f"{tp / (tp + fp):.2f}" if tp + fp else "-"
            recall = f"{tp / (tp + fn):.2f}" if tp + fn else "-"
            lines.append(f"| {code} | {tp + fn} | {tp + fp} | {tp} | {precision} | {recall} |")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--part", nargs="+", choices=[*PART_NAMES, "both"], default=list(PART_NAMES)
    )
    parser.add_argument("--per-preset", action="store_true", help="add per-preset tables")
    args = parser.parse_args()
    parts = []
    for chosen in args.part:
        for part in ("dev", "test") if chosen == "both" else (chosen,):
            if part not in parts:
                parts.append(part)
    results = asyncio.run(run(parts))
    print(render(results))
    if args.per_preset:
        print()
        print(render_per_preset(results))


if __name__ == "__main__":
    main()
