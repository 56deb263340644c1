"""Mapping the judge's raw output onto what may be stored (§4).

Ids outside the candidate set are dropped; duplicate ids keep the highest confidence; a
confidence outside 0..1 (or not finite) drops that item, never clamped.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

from app import metrics
from app.providers.base import JudgeVerdict

MAX_UNMATCHED_CONCEPTS = 20
MAX_CONCEPT_CHARS = 100


@dataclass(frozen=True, slots=True)
class MappedJudgment:
    """``selections``: ``(keyword_id, confidence 0..1)``, best first; counts of dropped items."""

    selections: tuple[tuple[int, float], ...]
    unmatched_concepts: tuple[str, ...]
    dropped_unknown_ids: int
    dropped_bad_confidence: int


def map_verdict(verdict: JudgeVerdict, candidate_ids: Collection[int]) -> MappedJudgment:
    best: dict[int, float] = {}
    unknown = bad_confidence = 0
    for item in verdict.selected:
        if item.keyword_id not in candidate_ids:
            unknown += 1
            continue
        if not (math.isfinite(item.confidence) and 0.0 <= item.confidence <= 1.0):
            bad_confidence += 1
            continue
        best[item.keyword_id] = max(item.confidence, best.get(item.keyword_id, -1.0))
    if unknown:
        metrics.JUDGE_ITEMS_DROPPED.labels("unknown_id").inc(unknown)
    if bad_confidence:
        metrics.JUDGE_ITEMS_DROPPED.labels("confidence_out_of_range").inc(bad_confidence)
    selections = tuple(sorted(best.items(), key=lambda pair: (-pair[1], pair[0])))
    return MappedJudgment(
        selections=selections,
        unmatched_concepts=_clean_concepts(verdict.unmatched_concepts),
        dropped_unknown_ids=unknown,
        dropped_bad_confidence=bad_confidence,
    )


def _clean_concepts(concepts: tuple[str, ...]) -> tuple[str, ...]:
    cleaned: list[str] = []
    for concept in concepts:
        # Control characters (NUL above all: jsonb rejects it) carry no meaning in a concept.
        concept = "".join(c for c in concept if c.isprintable() or c == " ")
        concept = concept.strip()[:MAX_CONCEPT_CHARS]
        if concept and concept not in cleaned:
            cleaned.append(concept)
    return tuple(cleaned[:MAX_UNMATCHED_CONCEPTS])
