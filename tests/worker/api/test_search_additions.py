"""The worker's search additions for the core's fused search (docs/contract.md §7, Addition
"fused search"): ``matchedKeywordIds`` always; ``contextSimilarities`` and ``keywordHits`` only
when the request names ``contextIds``. Stored vectors sit at known cosines to the query."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import text

from tests.worker.api.test_search import DIMENSION, post_search, strict_json
from tests.worker.api.test_search_cuts import QUERY, USER, at_cosine, seed
from tests.worker.harness import PROFILE
from tests.worker.support import make_keyword, make_preset

BODY = {"userId": USER, "query": QUERY, "embeddingProfile": PROFILE}


async def _presets_and_keywords(engine) -> None:
    """Preset 101 PUBLIC at 0.5 on context 3 (0.8) and context 4 (confidence 0.9); 102
    BLOCKED at 0.9 on context 1; 103 PUBLIC at 0.1 on context 2."""
    for preset_id, visibility, cosine in ((101, "PUBLIC", 0.5), (102, "BLOCKED", 0.9),
                                          (103, "PUBLIC", 0.1)):  # fmt: skip
        await make_preset(
            engine,
            preset_id=preset_id,
            code=f"ADD_TEST_{preset_id}",
            visibility=visibility,
            embedding=at_cosine(QUERY, cosine, seed=preset_id),
            profile=PROFILE,
        )
    await make_keyword(engine, context_id=3, keyword_id=101, confidence=0.8)
    await make_keyword(engine, context_id=4, keyword_id=101, confidence=0.9)
    await make_keyword(engine, context_id=1, keyword_id=102)
    await make_keyword(engine, context_id=2, keyword_id=103)


async def test_without_context_ids_the_answer_is_s7s_list_and_the_matched_presets(engine, worker):
    await seed(engine, QUERY, [0.9, 0.8, 0.7, 0.6])
    await _presets_and_keywords(engine)

    answer = strict_json(await post_search(worker, BODY))

    assert [r["recordId"] for r in answer["results"]] == [10, 20, 30, 40]
    assert answer["matchedKeywordIds"] == [101]
    assert "contextSimilarities" not in answer and "keywordHits" not in answer


async def test_context_ids_get_their_cosines_and_the_keyword_hits(engine, worker):
    await seed(engine, QUERY, [0.9, 0.8, 0.7, 0.6])
    await _presets_and_keywords(engine)
    async with engine.begin() as conn:  # context 2's vector is hidden (deleted)
        await conn.execute(
            text("UPDATE ai.context_embedding SET is_deleted = true WHERE context_id = 2")
        )

    answer = strict_json(await post_search(worker, BODY | {"contextIds": [2, 3, 999]}))

    assert [(c["contextId"], round(c["similarity"], 4)) for c in answer["contextSimilarities"]] == [
        (3, 0.7)
    ]
    assert [
        (k["recordId"], k["contextId"], round(k["similarity"], 4), k["confidence"])
        for k in answer["keywordHits"]
    ] == [(40, 4, 0.6, 0.9), (30, 3, 0.7, 0.8)]


@pytest.mark.parametrize("context_ids", [list(range(1, 202)), [0], ["1"]])
async def test_bad_context_ids_are_422(worker, context_ids):
    response = await post_search(worker, BODY | {"contextIds": context_ids})

    assert response.status_code == 422


async def _presets_at(engine, cosines: dict[int, float | None]) -> None:
    """Preset ``id`` PUBLIC at each cosine to the query (None: a zero vector, whose cosine is
    NaN), carried by context ``id - 300`` (record ``10 * (id - 300)``)."""
    for preset_id, cosine in cosines.items():
        vector = (
            np.zeros(DIMENSION, np.float32)
            if cosine is None
            else at_cosine(QUERY, cosine, seed=preset_id)
        )
        await make_preset(
            engine,
            preset_id=preset_id,
            code=f"TOP_TEST_{preset_id}",
            embedding=vector,
            profile=PROFILE,
        )
        await make_keyword(engine, context_id=preset_id - 300, keyword_id=preset_id)


async def test_keyword_match_top_keeps_only_the_closest_preset_above_the_threshold(
    engine, make_worker
):
    """PINLOG_SEARCH_KEYWORD_MATCH_TOP 1 (the offline default): of the presets above the
    threshold (0.5 and 0.45) only the closest matches, so only its record is keywordMatched and
    among the keyword hits; a zero preset vector (NaN) never takes its place."""
    await seed(engine, QUERY, [0.9, 0.8, 0.7, 0.6])
    await _presets_at(engine, {301: None, 303: 0.5, 304: 0.45, 302: 0.1})

    async with make_worker(search_keyword_match_top=1) as worker:
        answer = strict_json(await post_search(worker, BODY | {"contextIds": [1]}))

    assert answer["matchedKeywordIds"] == [303]
    assert {r["recordId"]: r["keywordMatched"] for r in answer["results"]} == {
        10: False,
        20: False,
        30: True,
        40: False,
    }
    assert [k["recordId"] for k in answer["keywordHits"]] == [30]


async def test_every_preset_above_the_threshold_matches_by_default_but_never_a_zero_vector(
    engine, worker
):
    await seed(engine, QUERY, [0.9, 0.8, 0.7, 0.6])
    await _presets_at(engine, {301: None, 303: 0.5, 304: 0.45, 302: 0.1})

    answer = strict_json(await post_search(worker, BODY))

    assert answer["matchedKeywordIds"] == [303, 304]
