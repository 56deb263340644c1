"""Builds the configured providers from ``Settings`` (composition helpers for ``main.py``).

``embedding_provider``: ``openai`` | ``hashing`` | ``use-multilingual``; ``judge_provider``:
``openai`` | ``similarity`` | ``learned``. An embedder whose model dimension is below the
database column's (``Settings.vector_dimension``) is wrapped in ``ZeroPaddedEmbedder``, so every
embedder built here returns float32 ``(vector_dimension,)``. Every judge gets
``Settings.judge_profile``, stored as ``model_profile`` with every analysis row (CONTRACT §4).
"""

from __future__ import annotations

from app.errors import ConfigurationError
from app.metrics import WorkerMetrics
from app.providers.base import EmbeddingProvider, KeywordJudge
from app.providers.hashing import HashingEmbedder
from app.providers.openai_compatible import OpenAIEmbedder, OpenAIJudge
from app.providers.padding import ZeroPaddedEmbedder
from app.providers.rate_budget import RateBudget, per_process
from app.providers.similarity_judge import SimilarityJudge
from app.settings import LEARNED_JUDGE_REVISION, Settings
from app.settings.profiles import openai_judge_profile


def build_embedding_provider(settings: Settings) -> EmbeddingProvider:
    """The embedder named by ``settings.embedding_provider``, padded to ``vector_dimension``.

    ``use-multilingual`` loads the sentence encoder (once per process, ~2 s, blocking).
    """
    embedder: EmbeddingProvider
    if settings.embedding_provider == "hashing":
        embedder = HashingEmbedder(settings.embedding_dimension)
    elif settings.embedding_provider == "openai":
        embedder = OpenAIEmbedder.from_settings(settings)
    elif settings.embedding_provider == "use-multilingual":
        from app.providers.sentence_encoder import UseMultilingualEmbedder

        embedder = UseMultilingualEmbedder()
    else:
        raise ConfigurationError(f"unknown embedding provider {settings.embedding_provider!r}")
    if embedder.dimension < settings.vector_dimension:
        return ZeroPaddedEmbedder(embedder, settings.vector_dimension)
    return embedder


def build_judge(settings: Settings, metrics: WorkerMetrics) -> KeywordJudge:
    """The judge named by ``settings.judge_provider``; an OpenAI judge counts its re-asks in
    ``metrics``."""
    if settings.judge_provider == "similarity":
        return SimilarityJudge(settings.judge_similarity_threshold, profile=settings.judge_profile)
    if settings.judge_provider == "openai":
        return OpenAIJudge.from_settings(settings, metrics)
    if settings.judge_provider == "learned":
        # Imported here: only a worker with the learned judge loads the analyser (at startup).
        from app.providers.learned_judge import LearnedJudge, load_model
        from app.providers.sentence_encoder import shared_encoder
        from pinlog_platform.korean_lemmas import shared_analyser

        return LearnedJudge(
            shared_encoder(),
            load_model(),
            shared_analyser(),
            fallback_threshold=settings.judge_similarity_threshold,
            profile=settings.judge_profile,
            revision=LEARNED_JUDGE_REVISION,
        )
    raise ConfigurationError(f"unknown judge provider {settings.judge_provider!r}")


def build_budgets(settings: Settings) -> dict[str, RateBudget]:
    """Each provider's rate budget: its ``*_PER_MINUTE`` settings divided by
    ``PINLOG_WORKER_REPLICAS`` (docs/scaling.md)."""
    replicas = settings.worker_replicas
    window = settings.rate_budget_window_seconds
    return {
        "embedding": RateBudget(
            "embedding",
            requests=per_process(settings.embedding_requests_per_minute, replicas),
            tokens=per_process(settings.embedding_tokens_per_minute, replicas),
            window_seconds=window,
        ),
        "judge": RateBudget(
            "judge",
            requests=per_process(settings.judge_requests_per_minute, replicas),
            tokens=per_process(settings.judge_tokens_per_minute, replicas),
            window_seconds=window,
        ),
    }


def build_fallback_judges(settings: Settings, metrics: WorkerMetrics) -> list[KeywordJudge]:
    """The OpenAI-compatible judges of ``PINLOG_JUDGE_FALLBACKS``, in order; each reads its
    key from the setting it names (``PINLOG_JUDGE_FALLBACK_<n>_API_KEY``)."""
    judges: list[KeywordJudge] = []
    for fallback in settings.judge_fallbacks:
        key = getattr(settings, fallback.api_key_setting.removeprefix("PINLOG_").lower())
        judges.append(
            OpenAIJudge(
                base_url=fallback.base_url,
                api_key=key.get_secret_value(),
                model=fallback.model,
                profile=openai_judge_profile(fallback.model),
                timeout_seconds=settings.provider_timeout_seconds,
                max_retries=settings.provider_max_retries,
                metrics=metrics,
                send_traceparent=settings.otel_traceparent_to_providers,
            )
        )
    return judges
