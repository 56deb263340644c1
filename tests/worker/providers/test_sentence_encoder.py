"""The offline multilingual encoder: real model, loaded once per test session (§5, FC-04)."""

from __future__ import annotations

import asyncio

import numpy as np

from app.providers.factory import build_embedding_provider
from app.providers.padding import ZeroPaddedEmbedder
from app.providers.sentence_encoder import UseMultilingualEmbedder, shared_encoder
from app.settings import Settings


async def test_vectors_are_unit_float32_512_in_input_order():
    embedder = UseMultilingualEmbedder()

    vectors = await embedder.embed(["조용한 북카페", "강아지랑 산책", "조용한 북카페"])

    assert [v.shape for v in vectors] == [(512,)] * 3
    assert {v.dtype for v in vectors} == {np.dtype(np.float32)}
    assert np.allclose([np.linalg.norm(v) for v in vectors], 1.0, atol=1e-5)
    # Batch composition changes float32 rounding only (the same text in one batch).
    assert np.allclose(vectors[0], vectors[2], atol=1e-5)


async def test_korean_meaning_not_shared_characters_decides_similarity():
    """'유모차 끌고 딸기 체험' shares no word with '아이와 함께' but means it; a note about
    hangover soup shares the character '아' only by accident."""
    embedder = UseMultilingualEmbedder()
    texts = [
        "유모차 끌고 아기랑 딸기 따기 체험",
        "아이를 데리고 가기 좋은 곳",
        "술 마신 다음 날 해장국",
    ]
    note, kids, hangover = await embedder.embed(texts)

    assert float(note @ kids) > float(note @ hangover) + 0.1


async def test_concurrent_calls_share_forward_passes():
    encoder = shared_encoder()
    before = encoder.batches
    texts = [f"동시에 들어온 메모 {n}번: 창가 자리가 좋았음" for n in range(8)]

    await asyncio.gather(*(encoder.encode([t]) for t in texts))

    assert encoder.batches - before <= 2  # one that started at once, one for the rest


async def test_a_text_just_encoded_is_served_from_the_cache():
    encoder = shared_encoder()
    text = "캐시 확인용 메모: 비 오는 날 파전"
    first = await encoder.encode([text])
    before = encoder.batches

    again = await encoder.encode([text])

    assert encoder.batches == before
    assert np.array_equal(first, again)


async def test_factory_pads_the_encoder_to_the_column_dimension():
    settings = Settings(
        database_url="postgresql+asyncpg://u:p@localhost/db",
        internal_secret="provider-test-internal-secret-0123456789",
        offline=True,
    )
    embedder = build_embedding_provider(settings)

    (vector,) = await embedder.embed(["한강뷰 카페"])

    assert isinstance(embedder, ZeroPaddedEmbedder)
    assert vector.shape == (1536,)
    assert not np.any(vector[512:])
    assert embedder.inner.encoder is shared_encoder()  # loaded once per process
