"""Personal search quality on the labelled member queries (docs/search.md "Measured").

Notes: ``bench/search_eval/notes.yaml`` (frozen, stable ids); queries:
``bench/search_eval/member_queries.yaml`` (kinds in_note, paraphrase, short, english,
no_match). This is the **development** set: the lexical floor and the fusion constant were
chosen on it (the rule below), so its figures are not held-back figures.

Each list is computed as the services compute it, in process: *semantic* is §7 (the query and
every note embedded by the offline encoder, the best cosine per record); *lexical* is BM25 over
the member's notes with the analyser's terms (``pinlog_platform.contract.search.lexical``, the
formula of the core's ``LEXICAL_MATCHES``); *keyword* is the core's name matches (presets whose
name or examples share a term with the query) plus the worker's keyword hits (presets whose
vector has a cosine above ``KEYWORD_MATCH_THRESHOLD`` to the query), over the keywords the
offline learned judge gives each note, best confidence first. Fusion and cuts are
``pinlog_platform.contract.search.fusion``; "before" is the semantic list with the cuts the core
applied before fusion (``BEFORE_CUTS``, chosen by ``bench/search_quality.py`` on topic queries).

The core's cuts under fusion (they drop only semantic-only results) are chosen here by a rule
fixed beforehand, after the lexical floor: among floors and word floors of 0.24..0.40 (the word
floor the lower) and ratios 0..0.9, the highest fusion recall@5 over queries with relevant
notes with at most ``NOTHING_AT_MOST`` of them answered with nothing; ties by no-match silence,
then higher floors and ratio. ``pinlog_platform.contract.search.MEASURED_CUTS`` holds the result
for the offline profile.

Scores are per record (search answers one row per record): recall@5 as
``bench/search_quality.py`` defines it (found among the first five / min(relevant, 5)), MRR@10,
nDCG@10 (binary gain), ``nothing`` the share of queries with relevant notes answered with no
result, ``silent`` the share of no-match queries answered with no result.

    .venv/bin/python -m bench.member_search_quality
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from app.providers.base import JudgeCandidate
from app.service.preset_loader import read_preset_file
from pinlog_platform.contract.search import SearchCuts, default_cuts
from pinlog_platform.contract.search.fusion import KEYWORD, LEXICAL, SEMANTIC, apply_cuts, fuse
from pinlog_platform.contract.search.lexical import bm25_scores
from pinlog_platform.contract.search.terms import analyse, query_terms

HERE = Path(__file__).with_name("search_eval")
LIMIT = 10
AT = 5
OFFLINE_PROFILE = "local-use-multilingual-v3-512-cosine-v1"
KEYWORD_MATCH_THRESHOLD = 0.30  # the worker's default (docs/contract.md §7)
KINDS = ("in_note", "paraphrase", "short", "english", "no_match")
# The lexical floor (a share of the query's best BM25 score among the member's notes: BM25's
# scale grows with the number of notes, so an absolute floor would hide every match of a
# member with few notes) is chosen by a rule fixed beforehand: among these shares, the one with
# the fusion's highest recall@5 over all queries with relevant notes; ties: the lower share.
FLOORS = [round(x, 2) for x in np.arange(0.0, 1.001, 0.05)]
BEFORE_CUTS = SearchCuts(floor=0.36, floor_word=0.24, top_ratio=0.50)
CUT_FLOORS = [round(x, 2) for x in np.arange(0.24, 0.401, 0.02)]
CUT_RATIOS = [round(x, 1) for x in np.arange(0.0, 0.91, 0.1)]
NOTHING_AT_MOST = 0.05


@dataclass(frozen=True, slots=True)
class Scores:
    recall: float
    mrr: float
    ndcg: float
    nothing: float
    silent: float
    count: int


def _load(name: str, key: str) -> list[dict]:
    return yaml.safe_load((HERE / name).read_text(encoding="utf-8"))[key]


def _unit(matrix: np.ndarray) -> np.ndarray:
    matrix = np.asarray(matrix, np.float64)
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


async def _prepare():
    from app.providers.learned_judge import LearnedJudge, load_model
    from app.providers.sentence_encoder import shared_encoder

    notes = _load("notes.yaml", "notes")
    queries = _load("member_queries.yaml", "queries")
    presets = [p for p in read_preset_file().presets if p.is_active]
    encoder = shared_encoder()
    note_vectors = _unit(await encoder.encode([n["text"] for n in notes]))
    query_vectors = _unit(await encoder.encode([q["query"] for q in queries]))
    preset_vectors = _unit(await encoder.encode([p.embedding_input() for p in presets]))
    judge = LearnedJudge(encoder, load_model(), fallback_threshold=0.3, profile="bench", revision=2)
    keywords = []
    for note, vector in zip(notes, note_vectors, strict=True):
        similarity = preset_vectors @ vector
        candidates = [
            JudgeCandidate(
                id=p.id,
                display_name=p.display_name,
                category=p.category,
                description=p.description,
                examples=p.examples,
                similarity=float(s),
                code=p.code,
            )
            for p, s in zip(presets, similarity, strict=True)
        ]
        verdict = await judge.judge(note["text"], candidates)
        keywords.append({int(s.keyword_id): float(s.confidence) for s in verdict.selected})
    return notes, queries, presets, note_vectors, query_vectors, preset_vectors, keywords


def _best_per_record(notes, indices, values) -> list[tuple[str, float]]:
    best: dict[str, float] = {}
    for i, value in zip(indices, values, strict=True):
        record = notes[i]["record"]
        if record not in best or value > best[record]:
            best[record] = value
    return sorted(best.items(), key=lambda item: (-item[1], item[0]))


def build_lists(data, floor: float):
    """Per query: the three lists (record names, best first) and each record's similarity."""
    notes, queries, presets, note_vectors, query_vectors, preset_vectors, keywords = data
    note_terms = [dict(zip(*_terms(n["text"]), strict=True)) for n in notes]
    preset_terms = {
        p.id: set(query_terms(" ".join([p.display_name, *p.examples]))) for p in presets
    }
    out = []
    for query, qvector in zip(queries, query_vectors, strict=True):
        mine = [i for i, n in enumerate(notes) if n["member"] == query["member"]]
        cosine = note_vectors[mine] @ qvector
        semantic = _best_per_record(notes, mine, cosine)
        similarity = dict(semantic)
        terms = query_terms(query["query"])
        bm25 = bm25_scores(terms, [note_terms[i] for i in mine])
        lexical = [(r, s) for r, s in _best_per_record(notes, mine, bm25) if s > 0]
        top = lexical[0][1] if lexical else 0.0
        lexical = [(r, s) for r, s in lexical if s >= floor * top]
        named = {pid for pid, words in preset_terms.items() if words & set(terms)}
        matched = {
            p.id
            for p, s in zip(presets, preset_vectors @ qvector, strict=True)
            if s > KEYWORD_MATCH_THRESHOLD
        }
        confidence: dict[str, float] = {}
        for i in mine:
            hit = [c for pid, c in keywords[i].items() if pid in named | matched]
            if hit:
                record = notes[i]["record"]
                confidence[record] = max(confidence.get(record, 0.0), max(hit))
        keyword = sorted(confidence, key=lambda r: (-confidence[r], -similarity[r], r))
        out.append(
            {
                LEXICAL: [r for r, _ in lexical][:LIMIT],
                SEMANTIC: [r for r, _ in semantic][:LIMIT],
                KEYWORD: keyword[:LIMIT],
                "similarity": similarity,
            }
        )
    return out


def _terms(text: str):
    t = analyse(text)
    return t.terms, t.counts


def _ranked(query, lists, names, cuts: SearchCuts, k: int) -> list[str]:
    records = sorted({r for name in names for r in lists[name]})
    ids = {r: i for i, r in enumerate(records)}
    fused = fuse({name: [ids[r] for r in lists[name]] for name in names}, k=k)
    similarity = {ids[r]: lists["similarity"].get(r) for r in records}
    kept = apply_cuts(query["query"], fused, similarity, cuts)
    return [records[f.record_id] for f in kept][:LIMIT]


def score(queries, notes, ranked: list[list[str]], kinds=KINDS) -> Scores:
    record_of = {n["id"]: n["record"] for n in notes}
    recalls, mrrs, ndcgs, nothing, silent = [], [], [], [], []
    for query, shown in zip(queries, ranked, strict=True):
        if query["kind"] not in kinds:
            continue
        wanted = {record_of[n] for n in query["relevant"]}
        if not wanted:
            silent.append(not shown)
            continue
        nothing.append(not shown)
        recalls.append(len(wanted & set(shown[:AT])) / min(len(wanted), AT))
        first = next((i for i, r in enumerate(shown[:LIMIT]) if r in wanted), None)
        mrrs.append(0.0 if first is None else 1 / (first + 1))
        dcg = sum(1 / math.log2(i + 2) for i, r in enumerate(shown[:LIMIT]) if r in wanted)
        ideal = sum(1 / math.log2(i + 2) for i in range(min(len(wanted), LIMIT)))
        ndcgs.append(dcg / ideal)

    def mean(values):
        return float(np.mean(values)) if values else float("nan")

    return Scores(
        mean(recalls),
        mean(mrrs),
        mean(ndcgs),
        mean(nothing),
        mean(silent),
        len(recalls) + len(silent),
    )


COMBINATIONS = [
    ("semantic, uncut (§7's list)", (SEMANTIC,), False),
    ("before: semantic with the cuts", (SEMANTIC,), True),
    ("lexical", (LEXICAL,), True),
    ("keyword", (KEYWORD,), True),
    ("lexical + semantic", (LEXICAL, SEMANTIC), True),
    ("lexical + keyword", (LEXICAL, KEYWORD), True),
    ("semantic + keyword", (SEMANTIC, KEYWORD), True),
    ("after: fusion of the three", (LEXICAL, SEMANTIC, KEYWORD), True),
]


def evaluate(data, floor: float, k: int, cuts: SearchCuts | None = None):
    """Every row of ``COMBINATIONS``: the semantic rows with ``BEFORE_CUTS``, the others with
    ``cuts`` (the offline profile's defaults when None)."""
    notes, queries = data[0], data[1]
    lists = build_lists(data, floor)
    cuts = default_cuts(OFFLINE_PROFILE) if cuts is None else cuts
    rows = []
    for label, names, cut in COMBINATIONS:
        applied = BEFORE_CUTS if names == (SEMANTIC,) else cuts
        ranked = [
            _ranked(q, lst, names, applied if cut else SearchCuts(), k)
            for q, lst in zip(queries, lists, strict=True)
        ]
        rows.append(
            (
                label,
                {kind: score(queries, notes, ranked, (kind,)) for kind in KINDS}
                | {"all": score(queries, notes, ranked)},
            )
        )
    return rows


def choose_cuts(data, floor: float, k: int) -> SearchCuts:
    """The rule of the module docstring for the fused search's cuts."""
    notes, queries = data[0], data[1]
    lists = build_lists(data, floor)
    names = (LEXICAL, SEMANTIC, KEYWORD)
    best = None
    for cut_floor, word, ratio in itertools.product(CUT_FLOORS, CUT_FLOORS, CUT_RATIOS):
        if word > cut_floor:
            continue
        cuts = SearchCuts(floor=float(cut_floor), floor_word=float(word), top_ratio=float(ratio))
        ranked = [_ranked(q, lst, names, cuts, k) for q, lst in zip(queries, lists, strict=True)]
        s = score(queries, notes, ranked)
        if s.nothing > NOTHING_AT_MOST:
            continue
        key = (round(s.recall, 6), round(s.silent, 6), cut_floor, word, ratio)
        if best is None or key > best[0]:
            best = (key, cuts)
    assert best is not None, "no cuts keep the share answered with nothing"
    return best[1]


def choose_floor(data, k: int) -> float:
    """The lexical floor by the rule at ``FLOORS``, under the cuts before fusion."""
    best = None
    for floor in FLOORS:
        recall = round(evaluate(data, floor, k, BEFORE_CUTS)[-1][1]["all"].recall, 6)
        if best is None or recall > best[0]:
            best = (recall, floor)
    return best[1]


def render(rows, floor: float, k: int, queries) -> str:
    counts = defaultdict(int)
    for q in queries:
        counts[q["kind"]] += 1
    kinds = ", ".join(f"{kind} {n}" for kind, n in counts.items())
    lines = [
        f"{len(queries)} development queries ({kinds}), limit {LIMIT}; lexical floor {floor}, "
        f"RRF k {k}",
        "",
        "| lists | recall@5 all | in-note | paraphrase | short | English | MRR@10 | nDCG@10 "
        "| answered with nothing | no-match silent |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, by_kind in rows:
        a = by_kind["all"]
        lines.append(
            f"| {label} | {a.recall:.2f} | {by_kind['in_note'].recall:.2f} | "
            f"{by_kind['paraphrase'].recall:.2f} | {by_kind['short'].recall:.2f} | "
            f"{by_kind['english'].recall:.2f} | {a.mrr:.2f} | {a.ndcg:.2f} | "
            f"{a.nothing:.1%} | {a.silent:.1%} |"
        )
    lines += [
        "",
        "Per kind, the fusion (after) and the semantic list with the cuts (before):",
        "",
        "| kind | | recall@5 | MRR@10 | nDCG@10 | answered with nothing | silent |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind in KINDS:
        for label, by_kind in (rows[1], rows[-1]):
            s = by_kind[kind]
            lines.append(
                f"| {kind} | {label.split(':')[0]} | {s.recall:.2f} | {s.mrr:.2f} | "
                f"{s.ndcg:.2f} | {s.nothing:.1%} | {s.silent:.1%} |"
            )
    return "\n".join(lines).replace("nan", "–")


async def run(k: int = 60) -> str:
    data = await _prepare()
    floor = choose_floor(data, k)
    cuts = choose_cuts(data, floor, k)
    rows = evaluate(data, floor, k, cuts)
    default = default_cuts(OFFLINE_PROFILE)
    note = (
        "the offline profile's defaults"
        if cuts == default
        else f"NOT the offline profile's defaults ({default.floor:.2f} / "
        f"{default.floor_word:.2f} / {default.top_ratio:.2f}): update MEASURED_CUTS"
    )
    return (
        render(rows, floor, k, data[1])
        + f"\n\nCuts under fusion chosen: {cuts.floor:.2f} / {cuts.floor_word:.2f} / "
        f"{cuts.top_ratio:.2f} ({note}); before: {BEFORE_CUTS.floor:.2f} / "
        f"{BEFORE_CUTS.floor_word:.2f} / {BEFORE_CUTS.top_ratio:.2f}"
    )


def main() -> None:
    print(asyncio.run(run()))


if __name__ == "__main__":
    main()
