"""Fitting a shorter model vector into the database's vector column by zero-padding (§5).

The ai.* columns are ``VECTOR(1536)``. A model of dimension ``d < 1536`` (the offline encoder:
512) is stored as its vector followed by ``1536 - d`` zeros. Padding changes neither the norm
nor any dot product, so the cosine between two padded vectors equals the cosine between the
originals exactly; the profile still names the model's true dimension (``...-512-cosine-v1``)
and differs from every 1536-d profile, so padded and native vectors are never compared (§5).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from app.errors import DimensionMismatchError
from app.providers.base import EmbeddingProvider


def zero_pad(vector: np.ndarray, dimension: int) -> np.ndarray:
    """float32 ``(d,)`` -> float32 ``(dimension,)``, the tail zeros; ``ValueError`` if d > dim."""
    if vector.ndim != 1 or vector.shape[0] > dimension:
        raise ValueError(f"cannot pad a vector of shape {vector.shape} to ({dimension},)")
    padded = np.zeros(dimension, dtype=np.float32)
    padded[: vector.shape[0]] = vector
    return padded


class ZeroPaddedEmbedder:
    """``EmbeddingProvider`` wrapping ``inner`` (model dimension ``d``); returns float32
    ``(dimension,)`` vectors. A vector of the inner provider that is not ``(d,)`` is a
    ``PermanentError`` naming both dimensions (FC-05 a)."""

    def __init__(self, inner: EmbeddingProvider, dimension: int) -> None:
        if inner.dimension > dimension:
            raise ValueError(f"model dimension {inner.dimension} exceeds column {dimension}")
        self.inner = inner
        self.dimension = dimension

    async def embed(self, texts: Sequence[str]) -> list[np.ndarray]:
        """The inner provider's vectors, each padded with zeros to ``dimension``."""
        vectors = await self.inner.embed(texts)
        padded = []
        for vector in vectors:
            if vector.shape != (self.inner.dimension,):
                raise DimensionMismatchError(
                    f"embedding dimension mismatch: expected {self.inner.dimension}, "
                    f"got {vector.shape[-1]}"
                )
            padded.append(zero_pad(vector, self.dimension))
        return padded

    async def aclose(self) -> None:
        """Release the inner provider."""
        await self.inner.aclose()
