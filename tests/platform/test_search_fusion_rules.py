"""The rules both services and ``bench/member_search_quality.py`` share (docs/search.md):
the fusion's list weights and which presets a query's meaning matches."""

from __future__ import annotations

from pinlog_platform.contract.search.fusion import KEYWORD, LEXICAL, RRF_K, SEMANTIC, fuse
from pinlog_platform.contract.search.keyword_match import matched_presets


def test_a_lists_weight_scales_its_share_of_the_fused_score():
    lists = {LEXICAL: [1], SEMANTIC: [2, 1], KEYWORD: [3]}
    weights = {LEXICAL: 1.5, SEMANTIC: 1.0, KEYWORD: 0.5}

    fused = fuse(lists, weights=weights)

    assert [(f.record_id, f.matched_by) for f in fused] == [
        (1, (LEXICAL, SEMANTIC)),
        (2, (SEMANTIC,)),
        (3, (KEYWORD,)),
    ]
    assert fused[0].score == 1.5 / (RRF_K + 1) + 1.0 / (RRF_K + 2)
    assert fused[2].score == 0.5 / (RRF_K + 1)


def test_a_lighter_list_loses_the_first_place_an_equal_weight_gives_it():
    lists = {LEXICAL: [1], SEMANTIC: [2]}

    plain = fuse(lists, weights={LEXICAL: 1.0, SEMANTIC: 1.0, KEYWORD: 1.0})
    lighter_lexical = fuse(lists, weights={LEXICAL: 0.5, SEMANTIC: 1.0, KEYWORD: 1.0})

    assert [f.record_id for f in plain] == [1, 2]  # a tie: the lower record id
    assert [f.record_id for f in lighter_lexical] == [2, 1]


def test_every_preset_above_the_threshold_matches_without_a_top():
    cosines = {1: 0.5, 2: 0.45, 3: 0.25, 4: 0.1}

    assert matched_presets(cosines, threshold=0.25, top=0) == {1, 2}


def test_a_top_keeps_only_the_closest_above_the_threshold_ties_by_the_lower_id():
    assert matched_presets({1: 0.5, 2: 0.6, 3: 0.1}, threshold=0.25, top=1) == {2}
    assert matched_presets({7: 0.4, 5: 0.4, 9: 0.3}, threshold=0.25, top=1) == {5}
    assert matched_presets({1: 0.2, 2: 0.1}, threshold=0.25, top=1) == set()
