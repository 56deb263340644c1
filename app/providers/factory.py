"""Builds the configured providers from ``Settings`` (composition helpers for ``main.py``).

``embedding_provider``: ``openai`` | ``hashing``; ``judge_provider``: ``openai`` | ``similarity``.
Every judge gets ``Settings.judge_profile``, the one place that names it; it is stored as
``model_profile`` with every analysis row (CONTRACT §4).
"""

from __future__ import annotations

from app.errors import ConfigurationError
from app.providers.base import EmbeddingProvider, KeywordJudge
from app.providers.hashing import HashingEmbedder
from app.providers.openai_compatible import OpenAIEmbedder, OpenAIJudge
from app.providers.similarity_judge import SimilarityJudge
from app.settings import Settings


def build_embedding_provider(settings: Settings) -> EmbeddingProvider:
    """The embedder named by ``settings.embedding_provider``, of ``embedding_dimension``."""
    if settings.embedding_provider == "hashing":
        return HashingEmbedder(settings.embedding_dimension)
    if settings.embedding_provider == "openai":
        return OpenAIEmbedder.from_settings(settings)
    raise ConfigurationError(f"unknown embedding provider {settings.embedding_provider!r}")


def build_judge(settings: Settings) -> KeywordJudge:
    """The judge named by ``settings.judge_provider``."""
    if settings.judge_provider == "similarity":
        return SimilarityJudge(settings.judge_similarity_threshold, profile=settings.judge_profile)
    if settings.judge_provider == "openai":
        return OpenAIJudge.from_settings(settings)
    raise ConfigurationError(f"unknown judge provider {settings.judge_provider!r}")
