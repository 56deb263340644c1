"""The embedding batcher re-sends inputs one by one only for an answer about one input: a
provider-wide 400 reaches every waiting stage after one call, never once per input."""

from __future__ import annotations

import asyncio

import numpy as np

from app.errors import InvalidInputError, ProviderUnavailableError
from app.providers.embedding_batcher import BatchingEmbedder
from app.providers.openai_compatible import OpenAIEmbedder
from tests.fake_openai import DEFAULT_DIMENSION, Scripted, error_body


def _batcher(fake) -> BatchingEmbedder:
    provider = OpenAIEmbedder(
        base_url=fake.base_url,
        api_key="sk-test",
        model="text-embedding-3-small",
        dimension=DEFAULT_DIMENSION,
        timeout_seconds=5.0,
        max_retries=2,
    )
    return BatchingEmbedder(provider, max_batch=3, max_wait_seconds=5)


async def _three(batcher: BatchingEmbedder, texts: list[str]) -> list[object]:
    return await asyncio.gather(*(batcher.embed([t]) for t in texts), return_exceptions=True)


async def test_a_provider_wide_400_is_one_call_for_the_whole_batch(fake) -> None:
    fake.set_fault(
        "embeddings",
        Scripted(status=400, json=error_body("base64 unsupported", param="encoding_format")),
    )
    batcher = _batcher(fake)

    results = await _three(batcher, ["하나", "둘", "셋"])

    assert fake.embedding_calls == 1
    assert all(isinstance(r, ProviderUnavailableError) for r in results)
    await batcher.aclose()
    await batcher.provider.aclose()


async def test_an_input_400_is_resolved_input_by_input(fake) -> None:
    fake.fail_inputs_containing(
        "#LONG",
        Scripted(status=400, json=error_body("too long", code="context_length_exceeded")),
    )
    batcher = _batcher(fake)

    first, long, third = await _three(batcher, ["하나", "둘 #LONG", "셋"])

    assert fake.embedding_calls == 4  # the batch, then each input alone
    assert isinstance(long, InvalidInputError) and long.reason == "input_too_long"
    assert isinstance(first, list) and isinstance(first[0], np.ndarray)
    assert isinstance(third, list) and isinstance(third[0], np.ndarray)
    await batcher.aclose()
    await batcher.provider.aclose()
