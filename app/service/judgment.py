"""Mapping the judge's raw output onto what may be stored (§4), item by item.

Each item of ``selected`` is kept or dropped on its own; the valid items of an answer are kept
whatever its other items look like. Nothing is coerced: ``3.0`` and ``true`` are not ids,
``"0.8"`` is not a confidence. Drop reasons (metric label ``reason``, counted per item):

- ``not_an_object``: the item is not a JSON object;
- ``id_not_an_integer``: ``keywordId`` missing or of another JSON type (float, bool, string);
- ``unknown_id``: an integer that names no candidate of this request;
- ``confidence_not_a_number``: ``confidence`` missing or of another JSON type;
- ``confidence_out_of_range``: outside 0..1, NaN, infinite, or too large for a float;
- ``duplicate``: another item names the same id with a higher (or equal, earlier) confidence.

``unmatchedConcepts`` items that are not strings are dropped the same way (analysis data).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field

from app.providers.base import JudgeSelection, JudgeVerdict

MAX_UNMATCHED_CONCEPTS = 20
MAX_CONCEPT_CHARS = 100


@dataclass(frozen=True, slots=True)
class MappedJudgment:
    """``selections``: ``(keyword_id, confidence 0..1)``, best first (ties: lower id);
    ``dropped``: how many items were dropped, by reason (module docstring)."""

    selections: tuple[tuple[int, float], ...]
    unmatched_concepts: tuple[str, ...]
    dropped: Counter[str] = field(default_factory=Counter)


def map_verdict(verdict: JudgeVerdict, candidate_ids: Collection[int]) -> MappedJudgment:
    """Apply the §4 rules to ``verdict`` against this request's ``candidate_ids``."""
    best: dict[int, float] = {}
    dropped: Counter[str] = Counter()
    for item in verdict.selected:
        reason, keyword_id, confidence = _check(item, candidate_ids)
        if reason is not None:
            dropped[reason] += 1
        elif keyword_id in best:
            dropped["duplicate"] += 1
            best[keyword_id] = max(best[keyword_id], confidence)
        else:
            best[keyword_id] = confidence
    concepts = [c for c in verdict.unmatched_concepts if isinstance(c, str)]
    if len(concepts) < len(verdict.unmatched_concepts):
        dropped["concept_not_a_string"] += len(verdict.unmatched_concepts) - len(concepts)
    selections = tuple(sorted(best.items(), key=lambda pair: (-pair[1], pair[0])))
    return MappedJudgment(selections, _clean_concepts(concepts), dropped)


def _check(item: object, candidate_ids: Collection[int]) -> tuple[str | None, int, float]:
    """``(reason, id, confidence)``; ``reason`` is ``None`` for a valid item."""
    if not isinstance(item, JudgeSelection):
        return "not_an_object", 0, 0.0
    keyword_id, confidence = item.keyword_id, item.confidence
    if type(keyword_id) is not int:  # bool is a subclass of int: an exact type check
        return "id_not_an_integer", 0, 0.0
    if keyword_id not in candidate_ids:
        return "unknown_id", 0, 0.0
    if type(confidence) not in (int, float):
        return "confidence_not_a_number", 0, 0.0
    try:
        value = float(confidence)
    except OverflowError:  # a JSON integer too large for a float is out of range too
        return "confidence_out_of_range", 0, 0.0
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        return "confidence_out_of_range", 0, 0.0
    return None, keyword_id, value


def _clean_concepts(concepts: list[str]) -> tuple[str, ...]:
    cleaned: list[str] = []
    for concept in concepts:
        # Control characters (NUL above all: jsonb rejects it) carry no meaning in a concept.
        concept = "".join(c for c in concept if c.isprintable() or c == " ")
        concept = concept.strip()[:MAX_CONCEPT_CHARS]
        if concept and concept not in cleaned:
            cleaned.append(concept)
    return tuple(cleaned[:MAX_UNMATCHED_CONCEPTS])
