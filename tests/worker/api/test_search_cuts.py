"""Search cuts and ``keywordMatched`` on known vectors (§7 and its Deviation): stored vectors
are built at an exact cosine to the query's vector (the fake provider embeds with
``hash_embed``), so every floor and ratio is checked at a known similarity."""

from __future__ import annotations

import numpy as np
from sqlalchemy import text

from app.providers.hashing import hash_embed
from tests.worker.api.test_search import DIMENSION, search, strict_json
from tests.worker.harness import PROFILE
from tests.worker.support import make_embedding, make_keyword, make_preset, make_state

QUERY = "조용한 카페에서 노트북으로 공부하기"
WORD = "카페"  # two characters, no white space: the word floor applies
USER = 7
UNFINISHED_KEYWORDS_OF_CONTEXT_4 = text(
    "UPDATE ai.context_ai_state SET keyword_status = 'PROCESSING' WHERE context_id = 4"
)


def at_cosine(query: str, cosine: float, *, seed: int) -> np.ndarray:
    """A unit vector whose cosine with ``hash_embed(query)`` is exactly ``cosine``."""
    q = hash_embed(query, DIMENSION).astype(np.float64)
    other = np.random.default_rng(seed).standard_normal(DIMENSION)
    other -= (other @ q) * q
    other /= np.linalg.norm(other)
    return (cosine * q + np.sqrt(1 - cosine**2) * other).astype(np.float32)


async def seed(engine, query: str, cosines: list[float]) -> None:
    """Record ``10 * i`` with context ``i`` at each cosine, completed."""
    for i, cosine in enumerate(cosines, start=1):
        await make_state(
            engine, context_id=i, embedding_status="COMPLETED", keyword_status="COMPLETED"
        )
        await make_embedding(
            engine,
            context_id=i,
            user_id=USER,
            record_id=10 * i,
            embedding=at_cosine(query, cosine, seed=i),
            profile=PROFILE,
        )


def similarities(response) -> list[float]:
    return [round(r["similarity"], 4) for r in strict_json(response)["results"]]


COSINES = [0.9, 0.75, 0.6, 0.4, 0.26, -0.2]


async def test_by_default_the_worker_keeps_s7s_exact_result_set(engine, worker):
    await seed(engine, QUERY, COSINES)

    response = await search(worker, user_id=USER)

    assert similarities(response) == COSINES


async def test_floor_and_ratio_cut_a_sentence_query(engine, make_worker):
    await seed(engine, QUERY, COSINES)
    async with make_worker(search_similarity_floor=0.5, search_top_ratio=0.8) as worker:
        response = await search(worker, user_id=USER)
    # floor 0.5 keeps 0.9, 0.75, 0.6; 0.8 x 0.9 = 0.72 keeps 0.9 and 0.75.
    assert similarities(response) == [0.9, 0.75]


async def test_a_one_word_query_gets_the_word_floor(engine, make_worker):
    await seed(engine, WORD, COSINES)
    settings = {"search_similarity_floor": 0.5, "search_similarity_floor_word": 0.25}
    async with make_worker(**settings) as worker:
        word = await search(worker, user_id=USER, query=WORD)
        longer = await search(worker, user_id=USER, query="카페 공부")  # white space: no word
    assert similarities(word) == [0.9, 0.75, 0.6, 0.4, 0.26]
    assert all(s >= 0.5 for s in similarities(longer))


async def test_keyword_matched_uses_the_owners_visible_keywords_above_the_threshold(engine, worker):
    """Default threshold 0.30. Record 10: a PUBLIC preset at 0.5 -> matched. Record 20: a
    PRIVATE_ONLY preset at 0.5 (the owner sees it) -> matched. Record 30: a BLOCKED preset at
    0.9 and a PUBLIC one at 0.1 -> not matched. Record 40: a PUBLIC preset at 0.5 but its
    keyword stage not COMPLETED -> not matched."""
    await seed(engine, QUERY, [0.9, 0.8, 0.7, 0.6])
    presets = {
        101: ("PUBLIC", 0.5, 1),
        102: ("PRIVATE_ONLY", 0.5, 2),
        103: ("BLOCKED", 0.9, 3),
        104: ("PUBLIC", 0.1, 3),
        105: ("PUBLIC", 0.5, 4),
    }
    for preset_id, (visibility, cosine, context_id) in presets.items():
        await make_preset(
            engine,
            preset_id=preset_id,
            code=f"CUT_TEST_{preset_id}",
            visibility=visibility,
            embedding=at_cosine(QUERY, cosine, seed=preset_id),
            profile=PROFILE,
        )
        await make_keyword(engine, context_id=context_id, keyword_id=preset_id)
    async with engine.begin() as conn:
        from sqlalchemy import text

        await conn.execute(
            text(
                "UPDATE ai.context_ai_state SET keyword_status = 'PROCESSING' WHERE context_id = 4"
            )
        )

    results = strict_json(await search(worker, user_id=USER))["results"]

    assert {r["recordId"]: r["keywordMatched"] for r in results} == {
        10: True,
        20: True,
        30: False,
        40: False,
    }


async def test_keyword_matched_keeps_a_re_judged_contexts_previous_keywords(engine, worker):
    """§9 read rule, Deviation: record 10's keyword stage was sent back by a preset
    reclassification (marked), so its previous keyword still matches; record 20's is unfinished
    without the mark (a first judgment in flight), so nothing matches yet; record 30's
    re-judgment ended FAILED and its previous keyword still matches."""
    await seed(engine, QUERY, [0.9, 0.8, 0.7])
    for preset_id, context_id in ((201, 1), (202, 2), (203, 3)):
        await make_preset(
            engine,
            preset_id=preset_id,
            code=f"REJUDGED_{preset_id}",
            embedding=at_cosine(QUERY, 0.5, seed=preset_id),
            profile=PROFILE,
        )
        await make_keyword(engine, context_id=context_id, keyword_id=preset_id)
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE ai.context_ai_state SET keyword_status = CASE context_id "
                "WHEN 1 THEN 'PENDING' WHEN 2 THEN 'PROCESSING' ELSE 'FAILED' END, "
                "keyword_reprocess_version = CASE WHEN context_id = 2 THEN NULL ELSE 2 END "
                "WHERE context_id IN (1, 2, 3)"
            )
        )

    results = strict_json(await search(worker, user_id=USER))["results"]

    assert {r["recordId"]: r["keywordMatched"] for r in results} == {10: True, 20: False, 30: True}
