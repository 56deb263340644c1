"""Mapping the judge's raw verdict onto what may be stored (§4)."""

from __future__ import annotations

import math

import pytest

from app.providers.base import JudgeSelection, JudgeVerdict
from app.service.judgment import MAX_CONCEPT_CHARS, MAX_UNMATCHED_CONCEPTS, map_verdict

CANDIDATES = frozenset({11, 12, 13})


def verdict(*selected: tuple[int, float], unmatched: tuple[str, ...] = ()) -> JudgeVerdict:
    return JudgeVerdict(
        selected=tuple(JudgeSelection(keyword_id=k, confidence=c) for k, c in selected),
        unmatched_concepts=unmatched,
    )


def test_selections_are_kept_best_first():
    mapped = map_verdict(verdict((11, 0.4), (12, 0.9), (13, 0.6)), CANDIDATES)

    assert mapped.selections == ((12, 0.9), (13, 0.6), (11, 0.4))
    assert not mapped.dropped


def test_equal_confidences_are_ordered_by_id():
    mapped = map_verdict(verdict((13, 0.5), (11, 0.5)), CANDIDATES)

    assert mapped.selections == ((11, 0.5), (13, 0.5))


def test_ids_outside_the_candidates_are_dropped_and_counted():
    mapped = map_verdict(verdict((11, 0.8), (99, 0.9), (-1, 0.5)), CANDIDATES)

    assert mapped.selections == ((11, 0.8),)
    assert mapped.dropped == {"unknown_id": 2}


def test_duplicate_ids_keep_the_highest_confidence():
    mapped = map_verdict(verdict((12, 0.3), (12, 0.7), (12, 0.5)), CANDIDATES)

    assert mapped.selections == ((12, 0.7),)
    assert mapped.dropped == {"duplicate": 2}


@pytest.mark.parametrize("confidence", [-0.001, 1.001, 82.0, math.nan, math.inf, -math.inf])
def test_confidence_outside_zero_to_one_drops_the_item_without_clamping(confidence):
    mapped = map_verdict(verdict((11, confidence), (12, 0.5)), CANDIDATES)

    assert mapped.selections == ((12, 0.5),)
    assert mapped.dropped == {"confidence_out_of_range": 1}


def test_a_dropped_duplicate_does_not_remove_a_valid_one():
    mapped = map_verdict(verdict((11, 0.6), (11, 1.5), (11, math.nan)), CANDIDATES)

    assert mapped.selections == ((11, 0.6),)
    assert mapped.dropped == {"confidence_out_of_range": 2}


@pytest.mark.parametrize(
    ("item", "reason"),
    [
        ("12", "not_an_object"),
        (None, "not_an_object"),
        (JudgeSelection(True, 0.5), "id_not_an_integer"),
        (JudgeSelection(12.0, 0.5), "id_not_an_integer"),
        (JudgeSelection("12", 0.5), "id_not_an_integer"),
        (JudgeSelection(None, 0.5), "id_not_an_integer"),
        (JudgeSelection(99, 0.5), "unknown_id"),
        (JudgeSelection(12, "0.5"), "confidence_not_a_number"),
        (JudgeSelection(12, None), "confidence_not_a_number"),
        (JudgeSelection(12, True), "confidence_not_a_number"),
        (JudgeSelection(12, 10**400), "confidence_out_of_range"),
        (JudgeSelection(12, 2), "confidence_out_of_range"),
        (JudgeSelection(11, 0.95), "duplicate"),
    ],
)
def test_one_malformed_item_is_dropped_alone_and_the_valid_items_are_kept(item, reason):
    """Issue 7 item 3: never coerced (``12.0``, ``"12"``, ``true`` and ``"0.5"`` are not
    valid), never the whole answer: the two valid items around it stay."""
    answer = JudgeVerdict(
        selected=(JudgeSelection(11, 0.6), item, JudgeSelection(13, 0.4)),
        unmatched_concepts=("야경", 3, None),
    )

    mapped = map_verdict(answer, CANDIDATES)

    expected_11 = 0.95 if reason == "duplicate" else 0.6
    assert mapped.selections == ((11, expected_11), (13, 0.4))
    assert mapped.dropped == {reason: 1, "concept_not_a_string": 2}
    assert mapped.unmatched_concepts == ("야경",)


def test_integer_confidences_zero_and_one_are_numbers_not_coerced():
    mapped = map_verdict(verdict((11, 1), (12, 0)), CANDIDATES)

    assert mapped.selections == ((11, 1.0), (12, 0.0))


@pytest.mark.parametrize("confidence", [0.0, 1.0])
def test_confidence_bounds_are_inclusive(confidence):
    assert map_verdict(verdict((11, confidence)), CANDIDATES).selections == ((11, confidence),)


def test_zero_selected_is_an_empty_mapping_not_an_error():
    mapped = map_verdict(verdict(), CANDIDATES)

    assert mapped.selections == ()
    assert mapped.unmatched_concepts == ()


def test_unmatched_concepts_are_trimmed_deduplicated_and_blanks_dropped():
    mapped = map_verdict(
        verdict(unmatched=("  반려견 동반 ", "반려견 동반", "", "   ", "야경")), CANDIDATES
    )

    assert mapped.unmatched_concepts == ("반려견 동반", "야경")


def test_unmatched_concepts_are_cut_to_the_maximum_length():
    mapped = map_verdict(verdict(unmatched=("가" * (MAX_CONCEPT_CHARS + 50),)), CANDIDATES)

    assert mapped.unmatched_concepts == ("가" * MAX_CONCEPT_CHARS,)


def test_unmatched_concepts_are_limited_in_number_keeping_the_first():
    concepts = tuple(f"개념 {n}" for n in range(MAX_UNMATCHED_CONCEPTS + 5))

    mapped = map_verdict(verdict(unmatched=concepts), CANDIDATES)

    assert mapped.unmatched_concepts == concepts[:MAX_UNMATCHED_CONCEPTS]


def test_unmatched_concepts_lose_control_characters_that_jsonb_would_reject():
    mapped = map_verdict(verdict(unmatched=("야\x00경", "\x00", "주차\n가능")), CANDIDATES)

    assert mapped.unmatched_concepts == ("야경", "주차가능")
