"""Untrusted embedding vectors (CONTRACT §3.2, §4, §5, FC-04, FC-05).

Cosine similarity depends on direction only. A vector whose direction is fine must be judged
the same whatever its scale; a vector that cannot be stored or compared must never be stored.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from app.providers.hashing import hash_embed
from tests.fake_openai import Scripted, embedding_body
from tests.worker.support import (
    app_records,
    count_rows,
    fetch_state,
    keyword_rows,
    make_state,
    stored_embedding,
)

NOTE = "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음."
DIMENSION = 1536


@pytest.mark.parametrize("scale", [1e20, 1e-25], ids=["huge", "tiny"])
async def test_a_scaled_but_valid_vector_is_judged_like_the_unit_vector(
    engine, worker, fake_openai, scale
):
    """§4, FC-04: cosine depends on direction only: a float32-finite vector scaled by 1e20 or
    1e-25 gets the same candidates and keywords as its unit vector, and is stored."""
    unit = hash_embed(NOTE, DIMENSION)
    await make_state(engine, context_id=1)
    await make_state(engine, context_id=2)
    await worker.process(1, NOTE)  # the healthy reference
    reference = {k for k in await keyword_rows(engine, 1)}
    assert reference and fake_openai.judge_calls == 1

    fake_openai.script_embeddings(Scripted(json=embedding_body([unit.astype(float) * scale])))
    await worker.process(2, NOTE)

    stored = await stored_embedding(engine, 2)
    assert fake_openai.judge_calls == 2, "the judge was never asked"
    assert await fetch_state(engine, 2) == ("COMPLETED", "COMPLETED")
    assert set(await keyword_rows(engine, 2)) == reference
    assert stored is not None


BAD_VECTORS = {
    "nan_token": '{"object":"list","data":[{"index":0,"object":"embedding","embedding":[NaN'
    + ",0.5" * (DIMENSION - 1)
    + "]}]}",
    "infinity_token": '{"object":"list","data":[{"index":0,"object":"embedding","embedding":'
    "[Infinity" + ",0.5" * (DIMENSION - 1) + "]}]}",
    "float64_only": '{"object":"list","data":[{"index":0,"object":"embedding","embedding":[1e300'
    + ",0.5" * (DIMENSION - 1)
    + "]}]}",
    "strings": '{"object":"list","data":[{"index":0,"object":"embedding","embedding":["0.5"'
    + ",0.5" * (DIMENSION - 1)
    + "]}]}",
    "bools": '{"object":"list","data":[{"index":0,"object":"embedding","embedding":[true'
    + ",0.5" * (DIMENSION - 1)
    + "]}]}",
    "nulls": '{"object":"list","data":[{"index":0,"object":"embedding","embedding":[null'
    + ",0.5" * (DIMENSION - 1)
    + "]}]}",
    "nested": '{"object":"list","data":[{"index":0,"object":"embedding","embedding":[[0.5]'
    + ",0.5" * (DIMENSION - 1)
    + "]}]}",
    "index_as_float": '{"object":"list","data":[{"index":0.0,"object":"embedding","embedding":['
    + ",".join(["0.5"] * DIMENSION)
    + "]}]}",
    "index_as_bool": '{"object":"list","data":[{"index":false,"object":"embedding","embedding":['
    + ",".join(["0.5"] * DIMENSION)
    + "]}]}",
    "data_object": '{"object":"list","data":{"0":[0.5]}}',
    "body_list": "[]",
    "not_json": "<html>502 bad gateway</html>",
}


async def test_unstorable_vectors_are_provider_faults_nothing_stored_judge_not_called(
    engine, worker, fake_openai, caplog
):
    """FC-05, §6: NaN, Infinity, float64-only values, strings, booleans, nulls and malformed
    items are provider protocol faults: transient (left ``PROCESSING``), nothing stored, judge
    not called, never an unexpected error of ours."""
    for context_id, raw in enumerate(BAD_VECTORS.values(), start=1):
        await make_state(engine, context_id=context_id)
        fake_openai.script_embeddings(Scripted(raw_body=raw))
        await worker.process(context_id, NOTE)

    outcomes = {
        name: await fetch_state(engine, context_id)
        for context_id, name in enumerate(BAD_VECTORS, start=1)
    }
    assert {n: s for n, s in outcomes.items() if s != ("PROCESSING", "PENDING")} == {}
    assert sum([await count_rows(engine, "ai.context_embedding", i) for i in range(1, 13)]) == 0
    assert fake_openai.judge_calls == 0
    assert not [r for r in app_records(caplog, logging.ERROR) if "unexpected" in r.getMessage()]


async def test_integer_components_are_accepted_as_numbers(engine, worker, fake_openai):
    """§5: JSON integers are numbers: 1536 ints (not all zero) are a valid vector, stored as
    its unit vector (cosine depends on direction only)."""
    ints = [(i % 7) - 3 for i in range(DIMENSION)]
    fake_openai.script_embeddings(Scripted(json=embedding_body([ints])))
    await make_state(engine, context_id=1)

    await worker.process(1, NOTE)

    stored = await stored_embedding(engine, 1)
    assert stored is not None
    expected = np.asarray(ints, dtype=np.float64) / np.linalg.norm(ints)
    np.testing.assert_allclose(stored.embedding, expected, rtol=1e-6, atol=1e-7)
    assert (await fetch_state(engine, 1))[0] == "COMPLETED"
