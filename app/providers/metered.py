"""Provider wrappers that time every call and count its failures by class (§6).

They sit directly on the provider, below the circuit breaker and the embedding batcher: a call
the breaker refuses is not a provider call, and a batch of stages is one call. Whatever the
provider raises passes through unchanged.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from typing import TypeVar

import numpy as np
from prometheus_client import Histogram

from app.metrics import ProviderMetrics
from app.providers.base import EmbeddingProvider, JudgeCandidate, JudgeVerdict, KeywordJudge

T = TypeVar("T")


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
        return await _observed(self._metrics, self.provider.embed(texts))

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
        return await _observed(self._metrics, self.judge_provider.judge(text, candidates))

    async def aclose(self) -> None:
        await self.judge_provider.aclose()


async def _observed(metrics: ProviderMetrics, call: Awaitable[T]) -> T:
    """Await one provider call, observing its latency (seconds) and outcome in ``metrics``."""
    started = time.perf_counter()
    try:
        result = await call
    except asyncio.CancelledError:
        metrics.cancelled(time.perf_counter() - started)
        raise
    except Exception as exc:
        metrics.failed(time.perf_counter() - started, exc)
        raise
    metrics.succeeded(time.perf_counter() - started)
    return result
