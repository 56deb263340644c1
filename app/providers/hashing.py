"""Deterministic offline embedder for development and tests: no network, no model (CONTRACT §5).

Signed feature hashing of character n-grams (n = 1, 2, 3) and word unigrams into ``dimension``
buckets. Hangul syllables are single characters, so syllable bigrams and trigrams carry most of
the meaning of a Korean note; the same text always yields the same vector on every machine
(``hashlib.blake2b``, never Python's salted ``hash()``).
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from app.errors import PermanentError
from pinlog_platform.contract.states.failure_reasons import FailureReason

# Unigrams alone say little about meaning (a shared syllable is weak evidence of a shared topic).
_NGRAM_WEIGHTS = {1: 0.5, 2: 1.0, 3: 1.0}
_WORD_WEIGHT = 1.0


def hash_embed(text: str, dimension: int) -> np.ndarray:
    """Embed ``text`` as an L2-normalised float32 vector of shape ``(dimension,)``.

    Whitespace runs are collapsed to one space and trimmed first; features are character
    n-grams (n = 1, 2, 3; a lone space is not a feature) and whitespace-separated words, each
    weighted ``weight * (1 + ln(count))``. Raises ``ValueError`` for ``dimension < 1`` and
    ``PermanentError`` when the text has no features or the signed sum cancels out: a zero
    vector would make every cosine NaN (FC-04).
    """
    if dimension < 1:
        raise ValueError(f"dimension must be >= 1, got {dimension}")
    vector = np.zeros(dimension, dtype=np.float64)
    for feature, weight in _features(" ".join(text.split())).items():
        bucket, sign = _bucket(feature, dimension)
        vector[bucket] += sign * weight
    norm = float(np.linalg.norm(vector))
    if norm == 0.0:
        raise PermanentError(
            "hashing embedder produced a zero vector: the text has no features",
            reason=FailureReason.INPUT_REJECTED,
        )
    return (vector / norm).astype(np.float32)


class HashingEmbedder:
    """``EmbeddingProvider`` over :func:`hash_embed`; ``dimension`` is fixed at construction."""

    def __init__(self, dimension: int) -> None:
        if dimension < 1:
            raise ValueError(f"dimension must be >= 1, got {dimension}")
        self.dimension = dimension

    async def embed(self, texts: Sequence[str]) -> list[np.ndarray]:
        """One vector per input, in input order; ``PermanentError`` for a featureless text."""
        return [hash_embed(text, self.dimension) for text in texts]

    async def aclose(self) -> None:
        """Nothing to release."""


def _features(collapsed: str) -> dict[str, float]:
    features: dict[str, float] = {}
    for n, weight in _NGRAM_WEIGHTS.items():
        grams = Counter(collapsed[i : i + n] for i in range(len(collapsed) - n + 1))
        grams.pop(" ", None)
        for gram, count in grams.items():
            features[f"c{n}:{gram}"] = weight * (1.0 + math.log(count))
    words = Counter(word for word in collapsed.split(" ") if word)
    for word, count in words.items():
        features[f"w:{word}"] = _WORD_WEIGHT * (1.0 + math.log(count))
    return features


@lru_cache(maxsize=65536)
def _bucket(feature: str, dimension: int) -> tuple[int, float]:
    digest = int.from_bytes(hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest(), "big")
    # The top bit picks the sign so that collisions cancel on average instead of piling up.
    sign = -1.0 if digest >> 63 else 1.0
    return digest % dimension, sign
