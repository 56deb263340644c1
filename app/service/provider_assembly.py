"""The worker's providers as the stages and routes call them (§5, §6 with its deviation):
``open_providers`` wraps each provider built by ``providers/factory.py`` in its meter, usage
record and rate budget, puts a gate in front of each (probing with the unbatched provider,
capped by ``PINLOG_*_DAILY_TOKEN_CAP``), chains the fallback judges (``PINLOG_JUDGE_FALLBACKS``)
and the votes (``PINLOG_JUDGE_VOTES``), and batches the embedding stages' calls.

Here, not in ``app/providers/``: the gates, the judge chain and the votes are services, and
providers import nothing from the service layer. Called by the composition root only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass

from app.metrics import WorkerMetrics
from app.providers.base import EmbeddingProvider, KeywordJudge
from app.providers.embedding_batcher import BatchingEmbedder
from app.providers.factory import (
    build_budgets,
    build_embedding_provider,
    build_fallback_judges,
    build_judge,
)
from app.providers.metered import MeteredEmbedder, MeteredJudge
from app.providers.rate_budget import RateBudget
from app.providers.usage import StageTagged, StageTaggedJudge, attach_budget, attach_usage
from app.service.judge_chain import AnyJudgeGate, JudgeChain
from app.service.judge_votes import VotingJudge
from app.service.provider_gate import ProviderGate
from app.service.provider_probes import embedding_probe, judge_probe
from app.service.spend_guard import DailyTokenCap
from app.service.usage_ledger import UsageLedger
from app.settings import Settings


@dataclass(frozen=True, slots=True)
class Providers:
    """The providers one worker process calls.

    ``embedder``: metered, recorded in the usage ledger and held to its rate budget, untagged
    (tag each use: ``StageTagged(embedder, "search")``); ``stage_embedder``: the same embedder
    behind the micro-batcher, tagged ``embedding``, for the embedding stage; ``judge``: the
    keyword stage's judge (the fallback chain when fallbacks are set, voted when votes > 1),
    tagged ``keyword``; ``gates``: each provider's gate by name (``embedding``, ``judge``, the
    latter available while any judge of the chain is); ``embedding_batch_tokens``: this
    process's embedding tokens per budget window (``None``: no token budget), what one
    request of several texts carries at most.
    """

    embedder: EmbeddingProvider
    stage_embedder: EmbeddingProvider
    judge: KeywordJudge
    gates: Mapping[str, ProviderGate]
    embedding_batch_tokens: int | None = None


def open_providers(
    stack: AsyncExitStack, settings: Settings, metrics: WorkerMetrics, ledger: UsageLedger
) -> Providers:
    """The providers of ``settings``, counting in ``metrics`` and recording calls in ``ledger``;
    each is closed by ``stack`` (gates after the providers they guard are built, closed before
    them). Raises ``ConfigurationError`` for a provider the settings cannot build."""
    budgets = build_budgets(settings)
    embedder = MeteredEmbedder(
        build_embedding_provider(settings),
        metrics.providers["embedding"],
        batch_inputs=metrics.embedding_batch_inputs,
    )
    stack.push_async_callback(embedder.aclose)
    attach_usage(embedder, ledger)
    attach_budget(embedder, budgets["embedding"])
    # Concurrent embedding stages share provider requests; search is never delayed.
    stage_embedder = BatchingEmbedder(
        StageTagged(embedder, "embedding"),
        max_batch=settings.embedding_batch_size,
        max_wait_seconds=settings.embedding_batch_wait_ms / 1000,
        max_batch_tokens=budgets["embedding"].token_limit,
    )
    stack.push_async_callback(stage_embedder.aclose)
    judge = MeteredJudge(build_judge(settings, metrics), metrics.providers["judge"])
    stack.push_async_callback(judge.aclose)
    attach_usage(judge, ledger)
    attach_budget(judge, budgets["judge"])

    # One gate per provider, probing with the unbatched providers.
    embedding_gate = _gate(
        "embedding",
        embedding_probe(StageTagged(embedder, "probe")),
        settings,
        metrics,
        DailyTokenCap("embedding", settings.embedding_daily_token_cap, ledger, metrics),
        budgets["embedding"].cooldown_seconds,
    )
    judge_cap = DailyTokenCap("judge", settings.judge_daily_token_cap, ledger, metrics)
    first_gate = _gate(
        "judge",
        judge_probe(StageTaggedJudge(judge, "probe")),
        settings,
        metrics,
        judge_cap,
        budgets["judge"].cooldown_seconds,
    )
    stack.push_async_callback(first_gate.aclose)
    # PINLOG_JUDGE_FALLBACKS: each fallback judge behind its own circuit; the "judge" gate is
    # available while any of them is.
    links: list[tuple[KeywordJudge, ProviderGate]] = [(judge, first_gate)]
    for number, fallback in enumerate(build_fallback_judges(settings, metrics), start=1):
        metered = MeteredJudge(fallback, metrics.providers["judge"])
        stack.push_async_callback(metered.aclose)
        attach_usage(metered, ledger)
        budget = RateBudget(f"judge_fallback_{number}", requests=0, tokens=0)
        attach_budget(metered, budget)
        gate = _gate(
            f"judge_fallback_{number}",
            judge_probe(StageTaggedJudge(metered, "probe")),
            settings,
            metrics,
            judge_cap,
            budget.cooldown_seconds,
        )
        stack.push_async_callback(gate.aclose)
        links.append((metered, gate))
    chained: KeywordJudge = judge
    judge_gate: ProviderGate = first_gate
    if len(links) > 1:
        judge_gate = AnyJudgeGate([gate for _, gate in links])
        chained = JudgeChain(links)
    stack.push_async_callback(embedding_gate.aclose)
    return Providers(
        embedder=embedder,
        stage_embedder=stage_embedder,
        # Votes (PINLOG_JUDGE_VOTES) wrap the metered judge: each call is one provider call.
        judge=StageTaggedJudge(
            VotingJudge(chained, settings.judge_votes) if settings.judge_votes > 1 else chained,
            "keyword",
        ),
        gates={"embedding": embedding_gate, "judge": judge_gate},
        embedding_batch_tokens=budgets["embedding"].token_limit,
    )


def _gate(
    name: str,
    probe: Callable[[], Awaitable[object]],
    settings: Settings,
    metrics: WorkerMetrics,
    spend_cap: DailyTokenCap,
    cooldown: Callable[[], float],
) -> ProviderGate:
    return ProviderGate(
        name,
        metrics=metrics,
        threshold=settings.breaker_threshold,
        cooldown_seconds=settings.breaker_cooldown_seconds,
        probe=probe,
        spend_cap=spend_cap,
        cooldown=cooldown,
    )
