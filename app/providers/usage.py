"""What one provider call cost in tokens, and who is told about it.

``usage`` is read from every OpenAI-compatible answer (embeddings: ``prompt_tokens``; chat:
``prompt_tokens`` and ``completion_tokens``; both: ``prompt_tokens_details.cached_tokens``, the
part of the prompt the provider served from its prompt cache, 0 when absent). Some
OpenAI-compatible servers omit ``usage``: the figure is then estimated as UTF-8 bytes ÷ 3
(rounded up) of what was sent and what came back, and marked ``estimated``. A ``UsageSink``
receives one ``CallUsage`` per provider call (a re-ask is one more call); the caller's stage is
read from ``current_stage`` (a context variable set by ``StageTagged``), so one provider serves
the stages, search and the probes and each call is counted where it belongs.
"""

from __future__ import annotations

import contextvars
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

ESTIMATE_BYTES_PER_TOKEN = 3

# Who is calling: "embedding" / "keyword" (the stages), "search", "probe", "presets", "smoke".
current_stage: contextvars.ContextVar[str] = contextvars.ContextVar(
    "provider_stage", default="other"
)


@dataclass(frozen=True, slots=True)
class CallUsage:
    """One call's tokens. ``provider``: ``embedding`` or ``judge``; ``model``: the model asked
    for (the ledger's and the metric's label); ``answered_model``: the ``model`` field of the
    answer (``None`` when absent); ``estimated``: no ``usage`` in the answer;
    ``cached_prompt_tokens``: the part of ``prompt_tokens`` (chat) or ``embedding_tokens``
    (embeddings) read from the provider's prompt cache (``prompt_tokens_details.cached_tokens``),
    a part of those, never added to ``total`` again."""

    provider: str
    model: str
    answered_model: str | None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    embedding_tokens: int = 0
    estimated: bool = False
    cached_prompt_tokens: int = 0

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens + self.embedding_tokens


class UsageSink(Protocol):
    def record(self, stage: str, usage: CallUsage) -> None:
        """Take one call's usage; never blocks, never raises (the hot path calls it)."""
        ...


class BatchUsageSink(UsageSink, Protocol):
    def release(self, stage: str, usage: CallUsage, *, batch_id: str, estimate: int) -> None:
        """Settle provider batch ``batch_id``'s ``estimate`` (tokens recorded as estimated at
        its submission): take back ``usage``, what it counted above the tokens the results
        report, and mark the estimate counted; never blocks, never raises."""
        ...


def estimate_tokens(*texts: str) -> int:
    """UTF-8 bytes ÷ 3, rounded up: the estimate when an answer carries no ``usage``."""
    size = sum(len(text.encode("utf-8", "surrogatepass")) for text in texts)
    return -(-size // ESTIMATE_BYTES_PER_TOKEN)


def token_runs(texts: Sequence[str], limit: int) -> list[tuple[Sequence[str], int]]:
    """``texts`` cut, in order, into runs whose estimated tokens (``estimate_tokens``) fit
    ``limit``, each with its estimate; a text larger than ``limit`` is a run of its own (the
    budget sends it alone in an empty window)."""
    runs: list[tuple[Sequence[str], int]] = []
    start, total = 0, 0
    for index, text in enumerate(texts):
        tokens = estimate_tokens(text)
        if index > start and total + tokens > limit:
            runs.append((texts[start:index], total))
            start, total = index, 0
        total += tokens
    runs.append((texts[start:], total))
    return runs


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _answered_model(body: Any) -> str | None:
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) and model else None


def _cached(usage: Any, prompt: int) -> int:
    """``prompt_tokens_details.cached_tokens``, at most ``prompt`` (a figure beyond the prompt
    it is a part of is not believed past it); 0 when absent or malformed."""
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else None
    return min(cached, prompt) if cached is not None else 0


def embedding_usage(model: str, body: Any, texts: Sequence[str]) -> CallUsage:
    usage = body.get("usage") if isinstance(body, dict) else None
    tokens = None
    if isinstance(usage, dict):
        tokens = _count(usage.get("prompt_tokens"))
        if tokens is None:
            tokens = _count(usage.get("total_tokens"))
    if tokens is None:
        return CallUsage(
            "embedding", model, _answered_model(body),
            embedding_tokens=estimate_tokens(*texts), estimated=True,
        )  # fmt: skip
    return CallUsage(
        "embedding", model, _answered_model(body),
        embedding_tokens=tokens, cached_prompt_tokens=_cached(usage, tokens),
    )  # fmt: skip


def chat_usage(model: str, body: Any, sent: Sequence[str]) -> CallUsage:
    usage = body.get("usage") if isinstance(body, dict) else None
    prompt = completion = None
    if isinstance(usage, dict):
        prompt = _count(usage.get("prompt_tokens"))
        completion = _count(usage.get("completion_tokens"))
    if prompt is not None and completion is not None:
        return CallUsage(
            "judge",
            model,
            _answered_model(body),
            prompt_tokens=prompt,
            completion_tokens=completion,
            cached_prompt_tokens=_cached(usage, prompt),
        )
    return CallUsage(
        "judge", model, _answered_model(body),
        prompt_tokens=prompt if prompt is not None else estimate_tokens(*sent),
        completion_tokens=completion if completion is not None else estimate_tokens(_content(body)),
        estimated=True,
    )  # fmt: skip


def _content(body: Any) -> str:
    try:
        content = body["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return ""
    return content if isinstance(content, str) else ""


class StageTagged:
    """An ``EmbeddingProvider`` whose calls count as ``stage`` (sets ``current_stage``)."""

    def __init__(self, provider: Any, stage: str) -> None:
        self.provider = provider
        self.dimension = provider.dimension
        self.stage = stage

    async def embed(self, texts: Sequence[str]) -> list[np.ndarray]:
        token = current_stage.set(self.stage)
        try:
            return await self.provider.embed(texts)
        finally:
            current_stage.reset(token)

    async def aclose(self) -> None:
        """The wrapped provider is closed by its owner."""


class StageTaggedJudge:
    """A ``KeywordJudge`` whose calls count as ``stage`` (sets ``current_stage``)."""

    def __init__(self, judge: Any, stage: str) -> None:
        self.judge_provider = judge
        self.stage = stage

    @property
    def profile(self) -> str:
        return self.judge_provider.profile

    async def judge(self, text: str, candidates: Sequence[Any]) -> Any:
        token = current_stage.set(self.stage)
        try:
            return await self.judge_provider.judge(text, candidates)
        finally:
            current_stage.reset(token)

    async def aclose(self) -> None:
        """The wrapped judge is closed by its owner."""


_WRAPPED = ("provider", "inner", "judge_provider")


def attach_budget(provider: Any, budget: Any) -> None:
    """Make every OpenAI-compatible provider inside ``provider``'s wrappers wait for
    ``budget`` (``RateBudget``) before each request."""
    seen = 0
    while provider is not None and seen < 8:
        if hasattr(provider, "use_budget"):
            provider.use_budget(budget)
        provider = next((getattr(provider, n) for n in _WRAPPED if hasattr(provider, n)), None)
        seen += 1


def attach_usage(provider: Any, sink: UsageSink) -> None:
    """Tell every OpenAI-compatible provider inside ``provider``'s wrappers about ``sink``
    (offline providers cost nothing and are not counted)."""
    seen = 0
    while provider is not None and seen < 8:
        if hasattr(provider, "usage"):
            provider.usage = sink
        provider = next((getattr(provider, n) for n in _WRAPPED if hasattr(provider, n)), None)
        seen += 1


class CollectingSink:
    """A ``UsageSink`` that keeps every call (``smoke``, tests)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, CallUsage]] = []

    def record(self, stage: str, usage: CallUsage) -> None:
        self.calls.append((stage, usage))
