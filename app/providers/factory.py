"""Builds the configured providers from ``Settings`` (composition helpers for ``main.py``).

``embedding_provider``: ``openai`` | ``hashing``; ``judge_provider``: ``openai`` | ``similarity``.
The judge's ``profile`` must equal ``Settings.judge_profile``, the value stored as
``model_profile`` with every analysis row (CONTRACT §4); a disagreement stops startup.
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
    """The judge named by ``settings.judge_provider``; raises ``ConfigurationError`` on a
    profile that disagrees with ``settings.judge_profile``."""
    judge: KeywordJudge
    if settings.judge_provider == "similarity":
        judge = SimilarityJudge(settings.judge_similarity_threshold)
    elif settings.judge_provider == "openai":
        judge = OpenAIJudge.from_settings(settings)
    else:
        raise ConfigurationError(f"unknown judge provider {settings.judge_provider!r}")
    if judge.profile != settings.judge_profile:
        raise ConfigurationError(
            f"judge profile {judge.profile!r} differs from settings {settings.judge_profile!r}"
        )
    return judge
