"""Search quality of the offline encoder on labelled queries, with and without the cuts.

Every development note (``bench/keyword_eval/dev.yaml``) is one record of one member; each
query of ``bench/search_eval/queries.yaml`` should find the notes labelled with one of its
codes (none for a query with no codes). Ranking is §7's: the whole query embedded once,
cosine against every note (what ``SEARCH_SIMILAR`` computes in PostgreSQL; zero-padding
changes no cosine), best first; then the cuts of ``pinlog_platform.contract.search``.

At 5: precision is the share of the first five shown results that are relevant (a query
shown nothing counts 1 when it has no relevant note and 0 otherwise), recall the share of
``min(relevant, 5)`` found among them (queries with relevant notes only). ``silent`` is the
share of queries with no relevant note that were shown nothing.

The offline defaults are chosen here by a rule fixed beforehand: among floors of at least 0.24
(so that every result a member gets is at least 0.24, as with the production defaults), the
highest precision of the cuts that keep recall at least 95 % of the uncut recall; ties by
recall, then lower floors and ratio.
The keyword-match threshold (``keywordMatched``) is chosen the same way on whether a query's
vector matches the preset vectors of its codes: the highest F1.

    .venv/bin/python -m bench.search_quality
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from app.service.preset_loader import read_preset_file
from bench.keyword_quality import load_part
from pinlog_platform.contract.search import PRODUCTION_CUTS, SearchCuts

QUERIES = Path(__file__).with_name("search_eval") / "queries.yaml"
AT = 5
RECALL_KEPT = 0.95
# The production defaults of the core (docs/contract.md §7), shown against the offline encoder.
PRODUCTION = PRODUCTION_CUTS
# Every result a member gets is at least 0.24 (the production word floor): no lower floors.
FLOORS = [round(x, 2) for x in np.arange(0.24, 0.61, 0.02)]
RATIOS = [round(x, 2) for x in np.arange(0.0, 0.91, 0.05)]
THRESHOLDS = [round(x, 2) for x in np.arange(0.10, 0.71, 0.02)]


@dataclass(frozen=True, slots=True)
class Hit:
    note: int
    similarity: float


@dataclass(frozen=True, slots=True)
class Quality:
    precision: float
    recall: float
    silent: float
    shown: float  # mean results shown per query, at most AT


def load_queries() -> list[dict]:
    return yaml.safe_load(QUERIES.read_text(encoding="utf-8"))["queries"]


def _unit(vectors: list[np.ndarray]) -> np.ndarray:
    matrix = np.vstack(vectors).astype(np.float64)
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


async def _embed(texts: list[str]) -> np.ndarray:
    from app.providers.sentence_encoder import UseMultilingualEmbedder

    return _unit(await UseMultilingualEmbedder().embed(texts))


def rankings(notes: np.ndarray, queries: np.ndarray) -> list[list[Hit]]:
    """Every note for every query, best first (ties by note index, like ``record_id``)."""
    similarity = queries @ notes.T
    return [
        [Hit(int(i), float(row[i])) for i in sorted(range(len(row)), key=lambda i: (-row[i], i))]
        for row in similarity
    ]


def quality(queries: list[dict], relevant: list[set[int]], ranked, cuts: SearchCuts) -> Quality:
    precisions, recalls, silent, shown = [], [], [], []
    for query, wanted, hits in zip(queries, relevant, ranked, strict=True):
        top = [hit.note for hit in cuts.apply(query["query"], hits[:AT])]
        found = len(wanted.intersection(top))
        shown.append(len(top))
        precisions.append(found / len(top) if top else float(not wanted))
        if wanted:
            recalls.append(found / min(len(wanted), AT))
        else:
            silent.append(not top)
    return Quality(
        float(np.mean(precisions)),
        float(np.mean(recalls)),
        float(np.mean(silent)) if silent else 1.0,
        float(np.mean(shown)),
    )


def choose_cuts(queries, relevant, ranked) -> tuple[SearchCuts, Quality]:
    """The rule of the module docstring, over FLOORS x FLOORS x RATIOS."""
    uncut = quality(queries, relevant, ranked, SearchCuts())
    best: tuple[tuple, SearchCuts, Quality] | None = None
    floors = [*FLOORS, 0.0]  # 0.0: the uncut reference, which always qualifies
    for floor, floor_word, ratio in itertools.product(floors, floors, RATIOS):
        if floor_word > floor or (floor == 0) != (floor_word == 0):
            continue  # the word floor is the lower one; both on, or both off (uncut)
        cuts = SearchCuts(floor=floor, floor_word=floor_word, top_ratio=ratio)
        q = quality(queries, relevant, ranked, cuts)
        if q.recall < RECALL_KEPT * uncut.recall:
            continue
        key = (round(q.precision, 6), round(q.recall, 6), -floor, -floor_word, -ratio)
        if best is None or key > best[0]:
            best = (key, cuts, q)
    assert best is not None
    return best[1], best[2]


def keyword_match(queries, query_vectors, preset_codes, preset_vectors) -> list[tuple]:
    """(threshold, precision, recall, f1) of "the query matches a preset of its codes"."""
    similarity = query_vectors @ preset_vectors.T
    rows = []
    for threshold in THRESHOLDS:
        tp = fp = fn = 0
        for query, row in zip(queries, similarity, strict=True):
            matched = {code for code, s in zip(preset_codes, row, strict=True) if s > threshold}
            wanted = set(query["codes"])
            tp, fp, fn = (
                tp + len(matched & wanted),
                fp + len(matched - wanted),
                fn + len(wanted - matched),
            )
        precision, recall = tp / max(tp + fp, 1), tp / max(tp + fn, 1)
        rows.append(
            (threshold, precision, recall, 2 * precision * recall / max(precision + recall, 1e-9))
        )
    return rows


async def run() -> str:
    notes = load_part("dev")
    queries = load_queries()
    presets = read_preset_file().presets
    note_vectors = await _embed([note["text"] for note in notes])
    query_vectors = await _embed([query["query"] for query in queries])
    preset_vectors = await _embed([preset.embedding_input() for preset in presets])
    relevant = [
        {i for i, note in enumerate(notes) if set(note["labels"]) & set(query["codes"])}
        for query in queries
    ]
    ranked = rankings(note_vectors, query_vectors)
    chosen, chosen_quality = choose_cuts(queries, relevant, ranked)
    rows = [
        (
            "no cuts (§7's exact result set)",
            SearchCuts(),
            quality(queries, relevant, ranked, SearchCuts()),
        ),
        (
            "production defaults 0.30 / 0.24 / 0.60",
            PRODUCTION,
            quality(queries, relevant, ranked, PRODUCTION),
        ),
        (
            f"offline defaults {chosen.floor:.2f} / {chosen.floor_word:.2f} / "
            f"{chosen.top_ratio:.2f}",
            chosen,
            chosen_quality,
        ),
    ]
    lines = [
        f"{len(queries)} queries ({sum(bool(r) for r in relevant)} with relevant notes), "
        f"{len(notes)} notes, offline encoder",
        "",
        "| cuts (floor / word floor / top ratio) | precision@5 | recall@5 "
        "| silent on no-match | shown per query |",
        "|---|---|---|---|---|",
    ]
    for label, _cuts, q in rows:
        lines.append(
            f"| {label} | {q.precision:.3f} | {q.recall:.3f} | {q.silent:.1%} | {q.shown:.2f} |"
        )
    matches = keyword_match(queries, query_vectors, [p.code for p in presets], preset_vectors)
    threshold, precision, recall, f1 = max(matches, key=lambda row: (row[3], row[0]))
    lines += [
        "",
        f"keywordMatched threshold {threshold:.2f}: precision {precision:.3f}, recall "
        f"{recall:.3f}, F1 {f1:.3f} (query vector against its codes' preset vectors)",
    ]
    return "\n".join(lines)


def main() -> None:
    print(asyncio.run(run()))


if __name__ == "__main__":
    main()
