"""Preset snapshots and candidate selection by cosine, in memory (§4, FC-04)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from app.repository.keyword_preset import PresetRow
from app.service.presets import PresetSnapshot, build_snapshot

PROFILE = "local-hashing-char-ngram-4-cosine-v1"


def preset(preset_id: int, embedding: list[float], *, version: int = 1) -> PresetRow:
    return PresetRow(
        id=preset_id,
        code=f"PRESET_{preset_id}",
        display_name=f"프리셋 {preset_id}",
        category="ACTIVITY",
        description="설명",
        examples=("예시",),
        embedding=np.asarray(embedding, dtype=np.float32),
        embedding_profile=PROFILE,
        visibility="PUBLIC",
        is_active=True,
        version=version,
    )


def query(*values: float) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


# Cosine with the query (1, 0, 0, 0): 1.0, 0.8, 0.6, 0.0, -1.0; the norms differ on purpose.
PRESETS = [
    preset(1, [0.0, 0.0, 5.0, 0.0]),
    preset(2, [4.0, 3.0, 0.0, 0.0]),
    preset(3, [2.0, 0.0, 0.0, 0.0]),
    preset(4, [-1.0, 0.0, 0.0, 0.0]),
    preset(5, [0.6, 0.0, 0.8, 0.0]),
]
EAST = query(1, 0, 0, 0)


def ids(candidates) -> list[int]:
    return [candidate.id for candidate in candidates]


def test_candidates_are_ordered_by_similarity_best_first():
    snapshot = build_snapshot(PROFILE, PRESETS)

    candidates = snapshot.candidates(EAST, top_k=10, floor=-1.0)

    assert ids(candidates) == [3, 2, 5, 1, 4]
    assert [c.similarity for c in candidates] == pytest.approx([1.0, 0.8, 0.6, 0.0, -1.0])


def test_candidates_are_cut_to_top_k():
    snapshot = build_snapshot(PROFILE, PRESETS)

    assert ids(snapshot.candidates(EAST, top_k=2, floor=-1.0)) == [3, 2]


def test_candidates_below_the_floor_are_excluded():
    snapshot = build_snapshot(PROFILE, PRESETS)

    assert ids(snapshot.candidates(EAST, top_k=10, floor=0.7)) == [3, 2]


def test_similarity_does_not_depend_on_the_query_norm():
    snapshot = build_snapshot(PROFILE, PRESETS)

    small = snapshot.candidates(EAST * 1e-3, top_k=10, floor=-1.0)
    large = snapshot.candidates(EAST * 1e3, top_k=10, floor=-1.0)

    assert ids(small) == ids(large)
    assert [c.similarity for c in small] == pytest.approx([c.similarity for c in large])


def test_candidate_carries_the_preset_fields_the_judge_needs():
    (candidate,) = build_snapshot(PROFILE, [PRESETS[2]]).candidates(EAST, top_k=1, floor=0.0)

    assert (candidate.id, candidate.display_name, candidate.category) == (3, "프리셋 3", "ACTIVITY")
    assert (candidate.description, candidate.examples) == ("설명", ("예시",))


@pytest.mark.parametrize(
    "bad_embedding",
    [[0.0, 0.0, 0.0, 0.0], [np.nan, 1.0, 0.0, 0.0], [np.inf, 0.0, 0.0, 0.0]],
    ids=["zero-norm", "nan", "inf"],
)
def test_preset_with_zero_or_non_finite_norm_is_rejected_and_never_a_candidate(
    caplog, bad_embedding
):
    snapshot = build_snapshot(PROFILE, [preset(1, [1.0, 0.0, 0.0, 0.0]), preset(9, bad_embedding)])

    assert [p.id for p in snapshot.presets] == [1]
    assert ids(snapshot.candidates(EAST, top_k=10, floor=-1.0)) == [1]
    assert any(r.levelno == logging.ERROR and "preset_id=9" in r.message for r in caplog.records)


def test_snapshot_of_only_rejected_presets_is_empty_and_yields_no_candidates():
    snapshot = build_snapshot(PROFILE, [preset(9, [0.0, 0.0, 0.0, 0.0])])

    assert snapshot.presets == ()
    assert snapshot.candidates(EAST, top_k=10, floor=-1.0) == []


def test_snapshot_version_is_the_list_version_of_the_rows_loaded():
    """The highest version among the rows the usable-presets statement returned, a rejected
    vector's included: the list version as the core computes it
    (pinlog_platform.contract.preset_list),
    so a worker never reports a version the core would wait for in vain."""
    snapshot = build_snapshot(
        PROFILE,
        [
            preset(1, [1.0, 0.0, 0.0, 0.0], version=3),
            preset(2, [0.0, 1.0, 0.0, 0.0], version=4),
            preset(9, [0.0, 0.0, 0.0, 0.0], version=7),  # rejected as a candidate only
        ],
    )

    assert snapshot.version == 7
    assert [p.id for p in snapshot.presets] == [1, 2]


def test_nan_similarity_is_never_a_candidate():
    unit = np.asarray([[1.0, 0.0, 0.0, 0.0], [np.nan, 0.0, 0.0, 0.0]], dtype=np.float32)
    snapshot = PresetSnapshot(PROFILE, 1, (PRESETS[2], PRESETS[3]), unit)

    assert ids(snapshot.candidates(EAST, top_k=10, floor=-1.0)) == [3]


@pytest.mark.parametrize(
    "bad_query",
    [query(0, 0, 0, 0), query(np.nan, 1, 0, 0), query(np.inf, 0, 0, 0)],
    ids=["zero", "nan", "inf"],
)
def test_zero_or_non_finite_query_vector_has_no_candidates(bad_query):
    snapshot = build_snapshot(PROFILE, PRESETS)

    assert snapshot.candidates(bad_query, top_k=10, floor=-1.0) == []
