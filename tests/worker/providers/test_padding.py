"""Zero-padding a 512-d model vector into the VECTOR(1536) column (§5)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from app.errors import PermanentError
from app.providers.padding import ZeroPaddedEmbedder, zero_pad


def test_zero_padding_preserves_norm_and_cosine_exactly():
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((2, 512)).astype(np.float32)
    a, b = a / np.linalg.norm(a), b / np.linalg.norm(b)

    pa, pb = zero_pad(a, 1536), zero_pad(b, 1536)

    assert pa.shape == (1536,) and pa.dtype == np.float32
    assert not np.any(pa[512:])
    assert float(pa @ pb) == float(a @ b)
    assert float(np.linalg.norm(pa)) == float(np.linalg.norm(a))


def test_padding_to_a_smaller_dimension_is_refused():
    with pytest.raises(ValueError, match="cannot pad"):
        zero_pad(np.ones(4, np.float32), 3)


class _Fixed:
    """An embedder that returns a vector of a fixed, possibly wrong, length."""

    dimension = 512

    def __init__(self, length: int) -> None:
        self.length = length

    async def embed(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.ones(self.length, np.float32) for _ in texts]

    async def aclose(self) -> None:
        pass


async def test_padded_embedder_returns_column_dimension():
    (vector,) = await ZeroPaddedEmbedder(_Fixed(512), 1536).embed(["x"])

    assert vector.shape == (1536,)


async def test_inner_vector_of_another_length_is_permanent_naming_both():
    """FC-05 a, through the padding layer: nothing is padded into shape."""
    with pytest.raises(PermanentError, match="expected 512, got 1024"):
        await ZeroPaddedEmbedder(_Fixed(1024), 1536).embed(["x"])
