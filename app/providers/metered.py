"""Provider wrappers that time every call and count its failures by class (§6).

They sit directly on the provider, below the circuit breaker and the embedding batcher: a call
the breaker refuses is not a provider call, and a batch of stages is one call. Whatever the
provider raises passes through unchanged.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import numpy as np
from prometheus_client import Histogram

from app.metrics import ProviderMetrics
from app.providers.base import EmbeddingProvider, JudgeCandidate, JudgeVerdict, KeywordJudge


class MeteredEmbedder:
    """An ``EmbeddingProvider`` that observes each request's latency (seconds), outcome and
    number of inputs; ``aclose`` closes the wrapped provider."""

    def __init__(
        self, provider: EmbeddingProvider, metrics: ProviderMetrics, *, batch_inputs: Histogram
    ) -> None:
        self.provider = provider
        self.dimension = provider.dimension
        self._metrics = metrics
        self._batch_inputs = batch_inputs

    async def embed(self, texts: Sequence[str]) -> list[np.ndarray]:
        """The wrapped provider's vectors for ``texts``; its errors, unchanged."""
        self._batch_inputs.observe(len(texts))
        started = time.perf_counter()
        try:
            vectors = await self.provider.embed(texts)
        except asyncio.CancelledError:
            self._metrics.cancelled(time.perf_counter() - started)
            raise
        except Exception as exc:
            self._metrics.failed(time.perf_counter() - started, exc)
            raise
        self._metrics.succeeded(time.perf_counter() - started)
        return vectors

    async def aclose(self) -> None:
        await self.provider.aclose()


class MeteredJudge:
    """A ``KeywordJudge`` that observes each judgment's latency (seconds, re-asks included)
    and outcome; ``aclose`` closes the wrapped judge."""

    def __init__(self, judge: KeywordJudge, metrics: ProviderMetrics) -> None:
        self.judge_provider = judge
        self.profile = judge.profile
        self._metrics = metrics

    async def judge(self, text: str, candidates: Sequence[JudgeCandidate]) -> JudgeVerdict:
        """The wrapped judge's verdict; its errors, unchanged."""
        started = time.perf_counter()
        try:
            verdict = await self.judge_provider.judge(text, candidates)
        except asyncio.CancelledError:
            self._metrics.cancelled(time.perf_counter() - started)
            raise
        except Exception as exc:
            self._metrics.failed(time.perf_counter() - started, exc)
            raise
        self._metrics.succeeded(time.perf_counter() - started)
        return verdict

    async def aclose(self) -> None:
        await self.judge_provider.aclose()
