"""Provider cost per 1,000 notes, from runs against the fake provider (the cost table of
docs/operations.md).

    .venv/bin/python -m bench.provider_cost [--notes N]

The real ``OpenAIEmbedder`` and ``OpenAIJudge`` send their requests over HTTP to
``tests/fake_openai.py``, which answers with ``usage`` as OpenAI reports it: about four
characters per token, the prompt counted as OpenAI renders it for its prompt cache (the
structured output schema first, then the messages), and
``usage.prompt_tokens_details.cached_tokens`` when a prompt repeats an earlier one's prefix of
at least 1,024 tokens (then in steps of 128). Tokens are priced by the ledger's ``cost_usd`` at
the default prices of ``app/settings/costs.py`` (text-embedding-3-small, gpt-4o-mini).

Notes: the notes of ``bench/keyword_eval/dev.yaml`` (real-looking Korean place notes), each
judged with ``keyword_top_k`` (10) candidates of the bundled preset list: the upper bound of what
the keyword stage sends (its similarity floor may send fewer). The candidates are the presets
nearest to the note by the fake's hash embedding, so the candidate sets vary as real ones do.

Judge layouts measured (the prompt layout by cost, item 2):

- ``p2``: today's request: the system instructions, then the note and its candidates (id, name,
  category, description, examples); the schema's ``keywordId`` enum holds the candidate ids.
- ``long``: a longer shared prefix: the instructions and the whole preset list in the system
  message, the note and its candidate ids in the user message; the same per-note enum.
- ``long-fixed-enum``: as ``long`` with the enum of every preset id, so the schema is the same
  for every note. Not a candidate (the enum of candidate ids stays, §4): it shows what the
  per-note enum costs the cache.

Rows of the cost table (item 3): live processing (one embedding of the note and one judgment),
a backfill via sync (one embedding per note under the new profile: the same tokens as the live
embedding), a reprocess via sync (one judgment per note, candidates from the stored vector: no
embedding call), each with the fake's prompt cache on and off; and a backfill and a reprocess
via ``batch``: the same request bodies as the worker's batch lines (``judge_messages`` /
``judge_request``, the backfill's embedding body) in one JSONL file per endpoint, through the
fake's Batch API (upload, create, polled to ``completed``), counted from the output lines'
``usage`` and priced at ``PINLOG_PROVIDER_BATCH_DISCOUNT``'s default (0.5) of the synchronous
prices, as the usage ledger prices them once a batch is settled.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import yaml

from app.metrics import WorkerMetrics
from app.providers import openai_wire
from app.providers.base import JudgeCandidate
from app.providers.hashing import hash_embed
from app.providers.openai_batches import BatchClient
from app.providers.openai_compatible import (
    JUDGE_SYSTEM_PROMPT,
    OpenAIEmbedder,
    OpenAIJudge,
    judge_messages,
    judge_request,
)
from app.providers.usage import CollectingSink, chat_usage, embedding_usage
from app.service.usage_ledger import cost_usd
from app.settings.costs import BATCH_DISCOUNT, DEFAULT_PRICES
from tests.fake_openai import FakeOpenAI

ROOT = Path(__file__).resolve().parents[1]
EMBEDDING_MODEL = "text-embedding-3-small"
JUDGE_MODEL = "gpt-4o-mini"
TOP_K = 10
DIMENSION = 256  # the fake's vectors: the dimension changes no token count

LONG_SYSTEM_PROMPT = (
    JUDGE_SYSTEM_PROMPT.replace(
        "The user message is JSON with the note and the candidate keywords.",
        "The keywords are listed below; the user message is JSON with the note and the ids of "
        "its candidate keywords.",
    )
    + "\n\nKeywords:\n"
)


@dataclass
class Totals:
    notes: int = 0
    prompt: int = 0
    completion: int = 0
    embedding: int = 0
    cached: int = 0

    def add(self, usage: Any) -> None:
        self.prompt += usage.prompt_tokens
        self.completion += usage.completion_tokens
        self.embedding += usage.embedding_tokens
        self.cached += usage.cached_prompt_tokens

    def per_1000(self, price_factor: float = 1.0) -> dict[str, Any]:
        scale = Decimal(1000) / Decimal(self.notes) * Decimal(str(price_factor))
        judged = cost_usd(
            DEFAULT_PRICES[JUDGE_MODEL], "judge", prompt=self.prompt,
            completion=self.completion, cached=self.cached,
        )  # fmt: skip
        embedded = cost_usd(DEFAULT_PRICES[EMBEDDING_MODEL], "embedding", embedding=self.embedding)
        usd = judged + embedded
        tokens = self.prompt + self.completion + self.embedding
        return {
            "tokens": round(tokens * 1000 / self.notes),
            "cached": round(self.cached * 1000 / self.notes),
            "usd": f"{usd * scale:.6f}",
        }


def _presets() -> list[JudgeCandidate]:
    raw = yaml.safe_load((ROOT / "app/presets/keyword_presets.yaml").read_text(encoding="utf-8"))
    return [
        JudgeCandidate(
            id=p["id"],
            display_name=p["display_name"],
            category=p["category"],
            description=p["description"],
            examples=tuple(p.get("examples") or ()),
            similarity=0.0,
            code=p["code"],
        )
        for p in raw["presets"]
        if p.get("is_active", True) and p.get("visibility") != "BLOCKED"
    ]


def _notes(limit: int) -> list[str]:
    part = yaml.safe_load((ROOT / "bench/keyword_eval/dev.yaml").read_text(encoding="utf-8"))
    return [note["text"] for note in part["notes"]][:limit]


def _candidates(note: str, presets: Sequence[JudgeCandidate]) -> list[JudgeCandidate]:
    vector = hash_embed(note, DIMENSION)
    scored = [
        (float(np.dot(vector, hash_embed(f"{p.display_name} {p.description}", DIMENSION))), p)
        for p in presets
    ]
    scored.sort(key=lambda pair: -pair[0])
    return [p for _, p in scored[:TOP_K]]


def _preset_list(presets: Sequence[JudgeCandidate]) -> str:
    return json.dumps(
        [
            {
                "id": p.id,
                "display_name": p.display_name,
                "category": p.category,
                "description": p.description,
                "examples": list(p.examples),
            }
            for p in presets
        ],
        ensure_ascii=False,
    )


async def _long_layout(
    client: httpx.AsyncClient,
    notes: Sequence[str],
    presets: Sequence[JudgeCandidate],
    *,
    fixed_enum: bool,
) -> Totals:
    """The ``long`` layouts, sent by hand (the judge does not build them) and counted from
    the answers' ``usage`` like the judge's."""
    system = LONG_SYSTEM_PROMPT + _preset_list(presets)
    all_ids = [p.id for p in presets]
    totals = Totals()
    for note in notes:
        candidates = _candidates(note, presets)
        ids = [c.id for c in candidates]
        user = json.dumps({"note": note, "candidates": ids}, ensure_ascii=False)
        payload = {
            "model": JUDGE_MODEL,
            "temperature": 0,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": user},
            ],
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "keyword_judgment",
                    "strict": True,
                    "schema": openai_wire.judgment_schema(all_ids if fixed_enum else ids),
                },
            },
        }
        answer = (await client.post("chat/completions", json=payload)).json()
        totals.add(chat_usage(JUDGE_MODEL, answer, [system, user]))
        totals.notes += 1
    return totals


async def _run(notes: Sequence[str], caching: bool) -> dict[str, Totals]:
    presets = _presets()
    with FakeOpenAI(dimension=DIMENSION) as fake:
        fake.set_prompt_cache(caching)
        embedder = OpenAIEmbedder(
            base_url=fake.base_url, api_key="bench", model=EMBEDDING_MODEL,
            dimension=DIMENSION, timeout_seconds=30, max_retries=0,
        )  # fmt: skip
        judge = OpenAIJudge(
            base_url=fake.base_url, api_key="bench", model=JUDGE_MODEL,
            profile=f"openai-chat-{JUDGE_MODEL}-bench", timeout_seconds=30, max_retries=0,
            metrics=WorkerMetrics(), top_k=TOP_K,
        )  # fmt: skip
        sink = CollectingSink()
        embedder.usage = judge.usage = sink
        embedding, p2 = Totals(), Totals()
        try:
            for note in notes:
                await embedder.embed([note])
                await judge.judge(note, _candidates(note, presets))
            for _stage, usage in sink.calls:
                (embedding if usage.provider == "embedding" else p2).add(usage)
            embedding.notes = p2.notes = len(notes)
            fake.set_prompt_cache(caching)  # each layout starts with an empty cache
            async with httpx.AsyncClient(base_url=fake.base_url, timeout=30) as client:
                long = await _long_layout(client, notes, presets, fixed_enum=False)
                fake.set_prompt_cache(caching)
                fixed = await _long_layout(client, notes, presets, fixed_enum=True)
        finally:
            await embedder.aclose()
            await judge.aclose()
    return {"embedding": embedding, "p2": p2, "long": long, "long-fixed-enum": fixed}


async def _batch(client: BatchClient, endpoint: str, bodies: Sequence[dict]) -> list[dict]:
    """``bodies`` as one batch of ``endpoint``, polled until ``completed``; its output lines."""
    content = b"".join(
        json.dumps(
            {"custom_id": str(i), "method": "POST", "url": endpoint, "body": body},
            ensure_ascii=False,
        ).encode()
        + b"\n"
        for i, body in enumerate(bodies)
    )
    batch = await client.create(await client.upload(content, "bench.jsonl"), endpoint, {})
    while batch["status"] != "completed":  # the fake moves one status per poll
        if batch["status"] in ("failed", "expired", "cancelled"):
            raise RuntimeError(f"batch {batch['id']} ended {batch['status']}")
        batch = await client.retrieve(str(batch["id"]))
    return await client.lines(batch.get("output_file_id"))


async def _batch_run(notes: Sequence[str], caching: bool) -> dict[str, Totals]:
    """The backfill's and the reprocess's work via ``batch``: one embedding batch and one
    judge batch over ``notes``, counted from the output lines' ``usage``."""
    presets = _presets()
    with FakeOpenAI(dimension=DIMENSION) as fake:
        fake.set_prompt_cache(caching)
        client = BatchClient(fake.base_url, "bench", 30, "bench")
        try:
            bodies = [
                {"model": EMBEDDING_MODEL, "input": note, "encoding_format": "base64"}
                for note in notes
            ]
            embedded = await _batch(client, "/v1/embeddings", bodies)
            judgments = []
            for note in notes:
                candidates = _candidates(note, presets)
                ids = list(dict.fromkeys(c.id for c in candidates))
                judgments.append(judge_request(JUDGE_MODEL, judge_messages(note, candidates), ids))
            judged = await _batch(client, "/v1/chat/completions", judgments)
        finally:
            await client.aclose()
    embedding, judge = Totals(notes=len(notes)), Totals(notes=len(notes))
    for line in embedded:
        embedding.add(embedding_usage(EMBEDDING_MODEL, line["response"]["body"], []))
    for line in judged:
        judge.add(chat_usage(JUDGE_MODEL, line["response"]["body"], []))
    return {"embedding": embedding, "p2": judge}


def _combined(*parts: Totals) -> Totals:
    total = Totals(notes=parts[0].notes)
    for part in parts:
        total.prompt += part.prompt
        total.completion += part.completion
        total.embedding += part.embedding
        total.cached += part.cached
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notes", type=int, default=384, help="notes of dev.yaml to run")
    args = parser.parse_args()
    notes = _notes(args.notes)
    runs = {caching: asyncio.run(_run(notes, caching)) for caching in (False, True)}
    batch_runs = {caching: asyncio.run(_batch_run(notes, caching)) for caching in (False, True)}
    print(f"{len(notes)} notes; per 1,000 notes at the default prices (USD)\n")
    print("| judge layout (one judgment per note) | prompt cache | tokens | cached | USD |")
    print("|---|---|---|---|---|")
    for layout in ("p2", "long", "long-fixed-enum"):
        for caching in (False, True):
            f = runs[caching][layout].per_1000()
            cache = "on" if caching else "off"
            print(f"| `{layout}` | {cache} | {f['tokens']} | {f['cached']} | {f['usd']} |")
    print("\n| work (today's layout, p2) | cache | tokens | cached | USD |")
    print("|---|---|---|---|---|")
    for name in ("live processing", "backfill via sync", "reprocess via sync"):
        for caching in (False, True):
            run = runs[caching]
            totals = {
                "live processing": _combined(run["embedding"], run["p2"]),
                "backfill via sync": run["embedding"],
                "reprocess via sync": run["p2"],
            }[name]
            f = totals.per_1000()
            cache = "with cache hits" if caching else "without"
            print(f"| {name} | {cache} | {f['tokens']} | {f['cached']} | {f['usd']} |")
    for name, part in (("backfill via batch", "embedding"), ("reprocess via batch", "p2")):
        for caching in (False, True):
            f = batch_runs[caching][part].per_1000(BATCH_DISCOUNT)
            cache = "with cache hits" if caching else "without"
            print(f"| {name} | {cache} | {f['tokens']} | {f['cached']} | {f['usd']} |")


if __name__ == "__main__":
    main()
