"""The search statements' plans stay linear in the user's vectors whatever the statistics
(§7; app/repository/context_embedding.py).

The tables here have never been analysed, as in a new deployment or right after a bulk
load: a join of the vectors with their state rows was then planned as a nested loop that read
every COMPLETED state row once per vector (200 vectors: 40,000 rows). Each statement runs
under EXPLAIN ANALYZE; the rows read from ``ai.context_ai_state`` (kept or filtered out) stay
within one per vector and check; the cosine is computed once per vector (its operator appears
in the vector scan's output and never in a filter above it)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sqlalchemy import text

from app.repository.context_embedding import SEARCH_ADDITIONS, SEARCH_SIMILAR
from tests.worker.api.test_search import DIMENSION
from tests.worker.harness import PROFILE
from tests.worker.support import make_embedding, make_keyword, make_preset, make_state

USER = 7
VECTORS = 60


async def _seed(engine) -> np.ndarray:
    # New files, no statistics: the rows earlier tests deleted (and what autovacuum learnt of
    # them) are not this test's subject.
    async with engine.begin() as conn:
        await conn.execute(text("TRUNCATE ai.context_ai_state, ai.context_embedding CASCADE"))
    rng = np.random.default_rng(5)
    for context_id in range(1, VECTORS + 1):
        await make_state(
            engine, context_id=context_id, embedding_status="COMPLETED", keyword_status="COMPLETED"
        )
        await make_embedding(
            engine,
            context_id=context_id,
            user_id=USER,
            record_id=context_id // 2,
            embedding=rng.standard_normal(DIMENSION).astype(np.float32),
            profile=PROFILE,
        )
    query = rng.standard_normal(DIMENSION).astype(np.float32)
    await make_preset(engine, preset_id=101, code="PLAN_TEST", embedding=query, profile=PROFILE)
    for context_id in range(1, VECTORS + 1, 3):
        await make_keyword(engine, context_id=context_id, keyword_id=101, confidence=0.5)
    return query


def _nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


async def _explain(engine, statement, params: dict) -> dict:
    async with engine.connect() as conn:
        explain = text("EXPLAIN (ANALYZE, VERBOSE, FORMAT JSON) " + str(statement))
        (document,) = (await conn.execute(explain, params)).one()
    return (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]


@pytest.mark.parametrize("statement", ["similar", "additions"])
async def test_state_rows_are_read_at_most_once_per_vector_without_statistics(engine, statement):
    query = await _seed(engine)
    params = {"query": query, "user_id": USER, "profile": PROFILE, "limit": 20}
    if statement == "similar":
        keyword = {"keyword_threshold": 0.3, "keyword_top": 1}
        plan = await _explain(engine, SEARCH_SIMILAR, params | keyword)
    else:
        params |= {"context_ids": list(range(1, VECTORS + 1)), "matched_ids": [101]}
        plan = await _explain(engine, SEARCH_ADDITIONS, params)

    state_rows_read = sum(
        (node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) * node["Actual Loops"]
        for node in _nodes(plan)
        if node.get("Relation Name") == "context_ai_state"
    )
    assert state_rows_read <= 2 * VECTORS  # the §7 list's check and the keyword check


async def test_the_cosine_is_computed_once_per_vector(engine):
    query = await _seed(engine)
    plan = await _explain(
        engine,
        SEARCH_SIMILAR,
        {"query": query, "user_id": USER, "profile": PROFILE, "limit": 20,
         "keyword_threshold": 0.3, "keyword_top": 1},
    )  # fmt: skip

    vector_scans = [
        node for node in _nodes(plan) if node.get("Relation Name") == "context_embedding"
        and any("<=>" in column for column in node.get("Output", []))
    ]  # fmt: skip
    assert len(vector_scans) == 1
    (scan,) = vector_scans
    assert scan["Actual Rows"] == VECTORS
    assert "<=>" not in scan.get("Filter", "")  # not once more to drop NaN
