"""Personal search quality on the labelled member queries (docs/search.md "Measured").

Notes: ``bench/search_eval/notes.yaml`` (frozen, stable ids); queries:
``bench/search_eval/member_queries.yaml`` (kinds in_note, paraphrase, short, english,
no_match). This is the **development** set: the lexical floor, the list weights, the keyword
match rule and the cuts were chosen on it (the rules below), so its figures are not held-back
figures.

Each list is computed as the services compute it, in process: *semantic* is §7 (the query and
every note embedded by the offline encoder, the best cosine per record); *lexical* is BM25 over
the member's notes with the analyser's terms (``pinlog_platform.contract.search.lexical``, the
formula of the core's ``LEXICAL_MATCHES``); *keyword* is the core's name matches (presets whose
name or examples share a term with the query) plus the worker's keyword hits (the presets the
query's meaning matches, ``pinlog_platform.contract.search.keyword_match``, the rule of the
worker's statement), over the keywords the offline learned judge gives each note, best
confidence first. Fusion and cuts are ``pinlog_platform.contract.search.fusion``; "before" is
the semantic list with the cuts the core applied before fusion (``BEFORE_CUTS``, chosen by
``bench/search_quality.py`` on topic queries).

Two rules, fixed before their grids were run:

1. The lexical floor, first, under ``BEFORE_CUTS`` and the plain fusion (``FLOORS``).
2. Then the fused search's tuning (``TUNING_GRID``): the keyword match threshold (the worker's
   ``PINLOG_SEARCH_KEYWORD_MATCH_THRESHOLD``, which also defines ``keywordMatched``) and how
   many of the presets above it count (every one, or only the closest), the weights of the
   lexical and keyword lists in the fusion (the semantic list's is 1), and the cuts on
   semantic-only results: floor and word floor each 0.10..0.50 (independently: under fusion
   a one-word query's own word is found by the lexical list, so its semantic-only neighbours
   need not pass the lower floor) and ratio 0..0.9. Among the settings that meet every
   constraint (``NOTHING_AT_MOST`` of the queries with relevant notes answered with nothing,
   ``SILENT_AT_LEAST`` of the no-match queries silent, the kind floors of
   ``KIND_RECALL_AT_LEAST``), the highest fusion recall@5 over the queries with relevant notes;
   ties by paraphrase recall@5, then no-match silence, then the fewest knobs moved from what
   shipped before (threshold 0.30, every preset, weights 1), then the higher floors and ratio.
   ``pinlog_platform.contract.search`` holds the result for the offline profile.

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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from app.providers.base import JudgeCandidate
from app.service.preset_loader import read_preset_file
from core_service.service.personal_search import LEXICAL_FLOOR_SHARE
from pinlog_platform.contract.search import SearchCuts, default_cuts, is_short_word
from pinlog_platform.contract.search.fusion import (
    KEYWORD,
    LEXICAL,
    LIST_WEIGHTS,
    SEMANTIC,
    apply_cuts,
    fuse,
)
from pinlog_platform.contract.search.keyword_match import matched_presets
from pinlog_platform.contract.search.lexical import bm25_scores
from pinlog_platform.contract.search.terms import analyse, query_terms

HERE = Path(__file__).with_name("search_eval")
LIMIT = 10
AT = 5
OFFLINE_PROFILE = "local-use-multilingual-v3-512-cosine-v1"
KINDS = ("in_note", "paraphrase", "short", "english", "no_match")
# The lexical floor (a share of the query's best BM25 score among the member's notes: BM25's
# scale grows with the number of notes, so an absolute floor would hide every match of a
# member with few notes) is chosen by a rule fixed beforehand: among these shares, the one with
# the fusion's highest recall@5 over all queries with relevant notes; ties: the lower share.
FLOORS = [round(x, 2) for x in np.arange(0.0, 1.001, 0.05)]
BEFORE_CUTS = SearchCuts(floor=0.36, floor_word=0.24, top_ratio=0.50)


@dataclass(frozen=True, slots=True)
class Tuning:
    """What rule 2 chooses: the keyword match (threshold, ``top`` 0 = every preset above it),
    each list's weight in the fusion, the cuts on semantic-only results."""

    threshold: float = 0.30
    top: int = 0
    lexical_weight: float = 1.0
    keyword_weight: float = 1.0
    cuts: SearchCuts = field(default_factory=SearchCuts)

    @property
    def weights(self) -> dict[str, float]:
        return {LEXICAL: self.lexical_weight, SEMANTIC: 1.0, KEYWORD: self.keyword_weight}

    @property
    def moved(self) -> int:
        """Knobs moved from what shipped before the grid."""
        return sum(
            (
                self.threshold != 0.30,
                self.top != 0,
                self.lexical_weight != 1.0,
                self.keyword_weight != 1.0,
            )
        )


# Rule 2's grid and constraints (module docstring), fixed before it was run.
KEYWORD_THRESHOLDS = (0.20, 0.25, 0.30, 0.35)
KEYWORD_TOPS = (0, 1)
LEXICAL_WEIGHTS = (0.5, 1.0, 1.5)
KEYWORD_WEIGHTS = (0.5, 1.0, 1.5, 2.0)
CUT_FLOORS = [round(x, 2) for x in np.arange(0.10, 0.501, 0.02)]
CUT_RATIOS = [round(x, 1) for x in np.arange(0.0, 0.91, 0.1)]
NOTHING_AT_MOST = 0.05
SILENT_AT_LEAST = 0.60
KIND_RECALL_AT_LEAST = {"in_note": 0.85, "short": 0.85, "english": 0.60}
# The fusion before rule 2: keyword threshold 0.30 (every preset above it), weights 1, the
# cuts chosen then for the fusion (0.26 / 0.26 / 0.60).
FUSION_BEFORE = Tuning(cuts=SearchCuts(floor=0.26, floor_word=0.26, top_ratio=0.60))


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
    from app.settings.profiles import LEARNED_JUDGE_REVISION, OFFLINE_DEFAULTS
    from pinlog_platform.korean_lemmas import shared_analyser

    notes = _load("notes.yaml", "notes")
    queries = _load("member_queries.yaml", "queries")
    presets = [p for p in read_preset_file().presets if p.is_active]
    encoder = shared_encoder()
    note_vectors = _unit(await encoder.encode([n["text"] for n in notes]))
    query_vectors = _unit(await encoder.encode([q["query"] for q in queries]))
    preset_vectors = _unit(await encoder.encode([p.embedding_input() for p in presets]))
    judge = LearnedJudge(
        encoder,
        load_model(),
        shared_analyser(),
        fallback_threshold=OFFLINE_DEFAULTS["judge_similarity_threshold"],
        profile="bench",
        revision=LEARNED_JUDGE_REVISION,
    )
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


def build_lists(data, floor: float, tuning: Tuning):
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
        matched = matched_presets(
            {p.id: float(s) for p, s in zip(presets, preset_vectors @ qvector, strict=True)},
            threshold=tuning.threshold,
            top=tuning.top,
        )
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


def _fused(lists, names, weights, k: int):
    """The fused ranking of ``names``' lists (record indices into ``records``) and each
    fused record's similarity."""
    records = sorted({r for name in names for r in lists[name]})
    ids = {r: i for i, r in enumerate(records)}
    fused = fuse(
        {name: [ids[r] for r in lists[name]] for name in names},
        k=k,
        weights={**LIST_WEIGHTS, **weights},
    )
    similarity = {ids[r]: lists["similarity"].get(r) for r in records}
    return records, fused, similarity


def _ranked(query, lists, names, cuts: SearchCuts, k: int, weights) -> list[str]:
    records, fused, similarity = _fused(lists, names, weights, k)
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


def evaluate(data, floor: float, k: int, tuning: Tuning, semantic_cuts=BEFORE_CUTS):
    """Every row of ``COMBINATIONS``: the semantic rows with ``semantic_cuts``, the others
    with ``tuning``."""
    notes, queries = data[0], data[1]
    lists = build_lists(data, floor, tuning)
    rows = []
    for label, names, cut in COMBINATIONS:
        applied = semantic_cuts if names == (SEMANTIC,) else tuning.cuts
        ranked = [
            _ranked(q, lst, names, applied if cut else SearchCuts(), k, tuning.weights)
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


def _outcomes(data, lists, k: int, weights):
    """Per query, per floor of ``CUT_FLOORS`` and ratio of ``CUT_RATIOS`` (the floor as the
    query's own, whichever of floor and word floor applies to it): recall@5 and whether the
    answer is empty. Arrays ``(queries, floors, ratios)``."""
    notes, queries = data[0], data[1]
    record_of = {n["id"]: n["record"] for n in notes}
    names = (LEXICAL, SEMANTIC, KEYWORD)
    recall = np.zeros((len(queries), len(CUT_FLOORS), len(CUT_RATIOS)))
    empty = np.zeros_like(recall, dtype=bool)
    for qi, (query, lst) in enumerate(zip(queries, lists, strict=True)):
        records, fused, similarity = _fused(lst, names, weights, k)
        wanted = {record_of[n] for n in query["relevant"]}
        for fi, ri in itertools.product(range(len(CUT_FLOORS)), range(len(CUT_RATIOS))):
            value, ratio = CUT_FLOORS[fi], CUT_RATIOS[ri]
            cuts = SearchCuts(floor=value, floor_word=value, top_ratio=ratio)
            shown = [
                records[f.record_id] for f in apply_cuts(query["query"], fused, similarity, cuts)
            ]
            empty[qi, fi, ri] = not shown
            if wanted:
                recall[qi, fi, ri] = len(wanted & set(shown[:AT])) / min(len(wanted), AT)
    return recall, empty


def choose_tuning(data, floor: float, k: int) -> tuple[Tuning, int, int]:
    """Rule 2 of the module docstring: the chosen tuning, how many settings were tried and how
    many met the constraints."""
    queries = data[1]
    kinds = np.array([q["kind"] for q in queries])
    short = np.array([is_short_word(q["query"]) for q in queries])
    relevant = np.array([bool(q["relevant"]) for q in queries])
    best, tried, kept = None, 0, 0
    for threshold, top in itertools.product(KEYWORD_THRESHOLDS, KEYWORD_TOPS):
        lists = build_lists(data, floor, Tuning(threshold=threshold, top=top))
        for lexical_weight, keyword_weight in itertools.product(LEXICAL_WEIGHTS, KEYWORD_WEIGHTS):
            weights = {LEXICAL: lexical_weight, SEMANTIC: 1.0, KEYWORD: keyword_weight}
            recall, empty = _outcomes(data, lists, k, weights)
            for (fi, f), (wi, w), (ri, ratio) in itertools.product(
                enumerate(CUT_FLOORS), enumerate(CUT_FLOORS), enumerate(CUT_RATIOS)
            ):
                tried += 1
                chosen = np.where(short, wi, fi)
                r = recall[np.arange(len(queries)), chosen, ri]
                e = empty[np.arange(len(queries)), chosen, ri]
                if e[relevant].mean() > NOTHING_AT_MOST or e[~relevant].mean() < SILENT_AT_LEAST:
                    continue
                if any(r[kinds == kind].mean() < at for kind, at in KIND_RECALL_AT_LEAST.items()):
                    continue
                kept += 1
                tuning = Tuning(
                    threshold,
                    top,
                    lexical_weight,
                    keyword_weight,
                    SearchCuts(floor=f, floor_word=w, top_ratio=ratio),
                )
                key = (
                    round(float(r[relevant].mean()), 6),
                    round(float(r[kinds == "paraphrase"].mean()), 6),
                    round(float(e[~relevant].mean()), 6),
                    -tuning.moved,
                    f,
                    w,
                    ratio,
                )
                if best is None or key > best[0]:
                    best = (key, tuning)
    assert best is not None, "no setting meets the constraints"
    return best[1], tried, kept


def choose_floor(data, k: int) -> float:
    """The lexical floor by rule 1, under the cuts before fusion and the plain fusion."""
    best = None
    plain = Tuning(cuts=BEFORE_CUTS)
    for floor in FLOORS:
        recall = round(evaluate(data, floor, k, plain)[-1][1]["all"].recall, 6)
        if best is None or recall > best[0]:
            best = (recall, floor)
    return best[1]


def shipped_tuning() -> Tuning:
    """What the services use for the offline profile: the worker's keyword match
    (``PINLOG_OFFLINE``'s defaults), the fusion's weights, the core's cuts."""
    from app.settings.limits import LimitSettings
    from app.settings.profiles import OFFLINE_DEFAULTS

    def setting(name: str):
        return OFFLINE_DEFAULTS.get(name, LimitSettings.model_fields[name].default)

    return Tuning(
        threshold=setting("search_keyword_match_threshold"),
        top=setting("search_keyword_match_top"),
        lexical_weight=LIST_WEIGHTS[LEXICAL],
        keyword_weight=LIST_WEIGHTS[KEYWORD],
        cuts=default_cuts(OFFLINE_PROFILE),
    )


def _row(label, by_kind) -> str:
    a = by_kind["all"]
    return (
        f"| {label} | {a.recall:.2f} | {by_kind['in_note'].recall:.2f} | "
        f"{by_kind['paraphrase'].recall:.2f} | {by_kind['short'].recall:.2f} | "
        f"{by_kind['english'].recall:.2f} | {a.mrr:.2f} | {a.ndcg:.2f} | "
        f"{a.nothing:.1%} | {a.silent:.1%} |"
    )


def render(rows, fusion_before, floor: float, k: int, queries) -> str:
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
    lines += [_row(label, by_kind) for label, by_kind in rows[:-1]]
    lines += [_row("fusion before the tuning", fusion_before[1]), _row(*rows[-1])]
    lines += [
        "",
        "Per kind: the semantic list with the cuts (before), the fusion before the tuning, "
        "the fusion (after):",
        "",
        "| kind | | recall@5 | MRR@10 | nDCG@10 | answered with nothing | silent |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind in KINDS:
        for label, by_kind in (
            ("before", rows[1][1]),
            ("fusion before", fusion_before[1]),
            ("after", rows[-1][1]),
        ):
            s = by_kind[kind]
            lines.append(
                f"| {kind} | {label} | {s.recall:.2f} | {s.mrr:.2f} | "
                f"{s.ndcg:.2f} | {s.nothing:.1%} | {s.silent:.1%} |"
            )
    return "\n".join(lines).replace("nan", "–")


def _described(tuning: Tuning) -> str:
    c = tuning.cuts
    top = "every preset" if not tuning.top else f"the closest {tuning.top}"
    return (
        f"keyword match above {tuning.threshold:.2f} ({top}); weights lexical "
        f"{tuning.lexical_weight:g}, keyword {tuning.keyword_weight:g}; cuts "
        f"{c.floor:.2f} / {c.floor_word:.2f} / {c.top_ratio:.2f}"
    )


async def run(k: int = 60) -> str:
    data = await _prepare()
    floor = choose_floor(data, k)
    chosen, tried, kept = choose_tuning(data, floor, k)
    rows = evaluate(data, floor, k, chosen)
    fusion_before = evaluate(data, floor, k, FUSION_BEFORE)[-1]
    shipped = shipped_tuning()
    note = (
        "what the services use"
        if chosen == shipped
        else f"NOT what the services use ({_described(shipped)}): update them"
    )
    if floor != LEXICAL_FLOOR_SHARE:
        note += f"; lexical floor NOT the core's {LEXICAL_FLOOR_SHARE}: update it"
    return (
        render(rows, fusion_before, floor, k, data[1])
        + f"\n\nRule 2: {kept} of {tried} settings meet the constraints; chosen: "
        f"{_described(chosen)} ({note}). Before fusion: cuts {BEFORE_CUTS.floor:.2f} / "
        f"{BEFORE_CUTS.floor_word:.2f} / {BEFORE_CUTS.top_ratio:.2f}"
    )


def main() -> None:
    print(asyncio.run(run()))


if __name__ == "__main__":
    main()
