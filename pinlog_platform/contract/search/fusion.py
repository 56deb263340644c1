"""Reciprocal rank fusion of personal search's lists (docs/search.md "Fusion"), one rule for
the core's ``POST /api/v1/search`` and for ``bench/member_search_quality.py``.

Each list ranks records best first. A record's fused score is the sum, over the lists that
hold it, of ``weight / (k + rank)`` (rank from 1; ``LIST_WEIGHTS``, chosen with the cuts on
the development queries); results are best score first, ties by the list count, then the lower
record id. ``matched_by`` names the lists that hold the record.

The cut rule (§7 Deviation, rewritten by the fused search): the similarity floors and the ratio
to the best ``similarity`` among the results apply only to results that the semantic list alone
found; a lexical or keyword match is always kept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pinlog_platform.contract.search import SearchCuts

RRF_K = 60
LEXICAL = "lexical"
SEMANTIC = "semantic"
KEYWORD = "keyword"
LIST_ORDER = (LEXICAL, SEMANTIC, KEYWORD)
# Each list's weight in the fused score, chosen with the cuts and the keyword match on the
# development queries (bench/member_search_quality.py, docs/search.md): a note's own word and
# its owner's keyword count more than the nearest vectors alone.
LIST_WEIGHTS: Mapping[str, float] = {LEXICAL: 1.5, SEMANTIC: 1.0, KEYWORD: 1.5}


@dataclass(frozen=True, slots=True)
class Fused:
    """One record's place in the fused ranking; ``matched_by`` in ``LIST_ORDER``."""

    record_id: int
    score: float
    matched_by: tuple[str, ...]


def fuse(
    lists: Mapping[str, Sequence[int]],
    *,
    k: int = RRF_K,
    weights: Mapping[str, float] = LIST_WEIGHTS,
) -> list[Fused]:
    """The records of ``lists`` (name -> record ids, best first; a record once per list) by
    fused score; ``weights``: name -> weight (every list of ``LIST_ORDER``)."""
    scores: dict[int, float] = {}
    names: dict[int, list[str]] = {}
    for name in LIST_ORDER:
        weight = weights[name]
        for rank, record_id in enumerate(lists.get(name, ()), start=1):
            scores[record_id] = scores.get(record_id, 0.0) + weight / (k + rank)
            names.setdefault(record_id, []).append(name)
    ordered = sorted(scores, key=lambda r: (-scores[r], -len(names[r]), r))
    return [Fused(r, scores[r], tuple(names[r])) for r in ordered]


def semantic_only(fused: Fused) -> bool:
    return fused.matched_by == (SEMANTIC,)


def apply_cuts(
    query: str,
    fused: Sequence[Fused],
    similarity: Mapping[int, float | None],
    cuts: SearchCuts,
) -> list[Fused]:
    """``fused`` without the semantic-only results that the cuts drop for ``query``:
    below the floor for the query (``SearchCuts.floor_for``), or below ``top_ratio`` times the
    best ``similarity`` (record id -> cosine, None: no vector) among all of ``fused``."""
    floor = cuts.floor_for(query)
    known = [s for s in (similarity.get(f.record_id) for f in fused) if s is not None]
    best = max(known, default=0.0)
    bar = cuts.top_ratio * best if cuts.top_ratio and best > 0 else None
    kept = []
    for item in fused:
        if semantic_only(item):
            value = similarity.get(item.record_id)
            if value is None or (floor and value < floor) or (bar is not None and value < bar):
                continue
        kept.append(item)
    return kept
