"""The usage ledger of one worker process: every answered provider call's tokens,
counted in ``pinlog_provider_tokens_total`` at once and written to ``ai.provider_usage_daily``
in batches, off the hot path.

``record`` (a ``UsageSink``) only adds to a dictionary and a counter: no I/O, no await, so a
stage pays nothing measurable. A background task writes the accumulated totals every
``PINLOG_USAGE_FLUSH_SECONDS`` (one transaction of its own on the support engine: never a
stage's transaction, never the stage pool), and ``aclose`` writes what is left on shutdown. A
write that fails keeps its totals for the next one (one WARNING line). A process killed with
SIGKILL loses at most the totals of its last interval: the ledger is an accounting aid, not a
bill.

Cached prompt tokens (``usage.prompt_tokens_details.cached_tokens``) are a part of the prompt
(chat) or input (embeddings) tokens: counted in the metric as ``kind="cached_prompt"`` beside
the full ``prompt``/``embedding`` count, kept in ``cached_prompt_tokens``, and priced at the
model's ``cached_prompt`` price instead of its ``prompt``/``embedding`` price.

A provider batch's tokens are recorded at its submission as an estimate (against the daily cap
at once); when the batch is settled, ``release`` takes back what the estimate counted above the
tokens its results report, from the row of the batch's submission day.

The day of a row is the database's UTC day at the write: calls of the last seconds before
midnight can land on the next day.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal

from sqlalchemy.ext.asyncio import AsyncEngine

from app.metrics import WorkerMetrics
from app.providers.usage import CallUsage
from app.repository.usage_ledger import (
    UsageDelta,
    UsageRelease,
    add_usage,
    release_estimates,
    tokens_today,
)
from app.settings.costs import ModelPrice

logger = logging.getLogger(__name__)

_MILLION = Decimal(1_000_000)


@dataclass(slots=True)
class _Totals:
    calls: int = 0
    prompt: int = 0
    completion: int = 0
    embedding: int = 0
    estimated: int = 0
    cached: int = 0

    def add(self, other: _Totals) -> None:
        self.calls += other.calls
        self.prompt += other.prompt
        self.completion += other.completion
        self.embedding += other.embedding
        self.estimated += other.estimated
        self.cached += other.cached


def cost_usd(
    price: ModelPrice,
    provider: str,
    *,
    prompt: int = 0,
    completion: int = 0,
    embedding: int = 0,
    cached: int = 0,
) -> Decimal:
    """USD of these tokens at ``price`` (USD per million tokens). ``cached`` is a part of
    ``prompt`` (``provider`` ``judge``) or of ``embedding`` (``embedding``), billed at the
    cached price instead of that kind's."""
    full = price.prompt if provider == "judge" else price.embedding
    micro = (
        Decimal(prompt) * Decimal(str(price.prompt))
        + Decimal(completion) * Decimal(str(price.completion))
        + Decimal(embedding) * Decimal(str(price.embedding))
        - Decimal(cached) * (Decimal(str(full)) - Decimal(str(price.cached_prompt_price)))
    )
    return max(micro, Decimal(0)) / _MILLION


# Stages whose calls go through the provider's Batch API, priced at the batch discount
# (app/service/batch_backfill.py, app/service/keyword_batches.py).
BATCH_STAGES = frozenset({"backfill_batch", "keyword_batch"})


class UsageLedger:
    """Collects ``CallUsage`` per (provider, model, stage); ``start`` begins the periodic
    writes, ``flush`` writes now, ``aclose`` stops and writes the rest."""

    def __init__(
        self,
        engine: AsyncEngine,
        metrics: WorkerMetrics,
        prices: Mapping[str, ModelPrice],
        *,
        flush_seconds: float,
        watch_totals: bool = False,
        batch_discount: float = 1.0,
    ) -> None:
        """``batch_discount``: the factor of the prices at which calls of ``BATCH_STAGES``
        (the provider's Batch API) are priced (``PINLOG_PROVIDER_BATCH_DISCOUNT``)."""
        self._engine = engine
        self._batch_discount = Decimal(str(batch_discount))
        self._tokens = metrics.provider_tokens
        self._prices = dict(prices)
        self._flush_seconds = flush_seconds
        self._pending: dict[tuple[str, str, str], _Totals] = {}
        self._releases: list[UsageRelease] = []
        self._task: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()
        self._failing = False
        # Today's tokens per provider for the spend guard, when ``watch_totals``:
        # every process's flushed total as last read, plus this process's since that read.
        self._watch_totals = watch_totals
        self._read_total: dict[str, int] = {}
        self._since_read: dict[str, int] = {}

    def tokens_today(self, provider: str) -> int:
        """``provider``'s tokens today (UTC): every process's written totals as last read
        (every ``flush_seconds``) plus this process's calls since. Another process's calls
        show with at most two intervals' delay."""
        return self._read_total.get(provider, 0) + self._since_read.get(provider, 0)

    async def read_totals(self) -> None:
        """Read today's totals of every provider (startup; then after each write)."""
        async with self._lock:
            await self._read_totals_locked({})

    async def _read_totals_locked(self, counted: dict[str, int]) -> None:
        async with self._engine.connect() as conn:
            totals = {p: await tokens_today(conn, p) for p in ("embedding", "judge")}
        self._read_total = totals
        for provider, tokens in counted.items():
            self._since_read[provider] = self._since_read.get(provider, 0) - tokens

    def record(self, stage: str, usage: CallUsage) -> None:
        key = (usage.provider, usage.model, stage)
        totals = self._pending.get(key)
        if totals is None:
            totals = self._pending[key] = _Totals()
        totals.calls += 1
        totals.prompt += usage.prompt_tokens
        totals.completion += usage.completion_tokens
        totals.embedding += usage.embedding_tokens
        totals.cached += usage.cached_prompt_tokens
        if usage.estimated:
            totals.estimated += usage.total
        if self._watch_totals:
            self._since_read[usage.provider] = self._since_read.get(usage.provider, 0) + usage.total
        for kind, count in (
            ("prompt", usage.prompt_tokens),
            ("completion", usage.completion_tokens),
            ("embedding", usage.embedding_tokens),
            ("cached_prompt", usage.cached_prompt_tokens),
        ):
            if count:
                self._tokens.labels(usage.provider, usage.model, stage, kind).inc(count)

    def release(self, stage: str, usage: CallUsage, *, batch_id: str, estimate: int) -> None:
        """Settle provider batch ``batch_id``'s ``estimate`` on the ledger row of the day it
        was submitted, at the next write, after what is pending (so an estimate not written
        yet is written first): take back ``usage`` (tokens the estimate counted above what
        the results report) and the estimate from ``estimated_tokens``. The token counter
        (``pinlog_provider_tokens_total``) keeps the estimate: a counter never goes down.
        Never blocks, never raises."""
        totals = _Totals(
            prompt=usage.prompt_tokens, completion=usage.completion_tokens,
            embedding=usage.embedding_tokens,
        )  # fmt: skip
        delta = self._delta((usage.provider, usage.model, stage), totals)
        self._releases.append(
            UsageRelease(
                batch_id, usage.provider, usage.model, stage, usage.prompt_tokens,
                usage.embedding_tokens, estimate, delta.cost_usd,
            )
        )  # fmt: skip
        if self._watch_totals:
            self._since_read[usage.provider] = self._since_read.get(usage.provider, 0) - usage.total

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="usage-ledger")

    async def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self._flush_seconds)
            if not self._stop.is_set():
                await self.flush()

    async def flush(self) -> None:
        """Write the totals collected since the last write (nothing when there are none)."""
        async with self._lock:
            pending, self._pending = self._pending, {}
            releases, self._releases = self._releases, []
            counted = dict(self._since_read)
            if not pending and not releases:
                if self._watch_totals:
                    await self._read_totals_quietly(counted)
                return
            deltas = [self._delta(key, totals) for key, totals in pending.items()]
            try:
                async with self._engine.begin() as conn:
                    await add_usage(conn, deltas)
                    await release_estimates(conn, releases)
            except Exception as exc:  # the next write tries again with the same totals
                for key, totals in pending.items():
                    self._pending.setdefault(key, _Totals()).add(totals)
                self._releases[:0] = releases
                if not self._failing:
                    logger.warning(
                        "usage ledger write failed, kept for the next: %s", type(exc).__name__
                    )
                self._failing = True
                return
            self._failing = False
            if self._watch_totals:
                await self._read_totals_quietly(counted)

    async def _read_totals_quietly(self, counted: dict[str, int]) -> None:
        try:
            await self._read_totals_locked(counted)
        except Exception as exc:  # the last totals stand until the next read
            logger.warning("usage ledger read failed: %s", type(exc).__name__)

    def _delta(self, key: tuple[str, str, str], totals: _Totals) -> UsageDelta:
        provider, model, stage = key
        price = self._prices.get(model)
        cost = None
        if price is not None:
            cost = cost_usd(
                price, provider, prompt=totals.prompt, completion=totals.completion,
                embedding=totals.embedding, cached=totals.cached,
            )  # fmt: skip
            if stage in BATCH_STAGES:
                cost *= self._batch_discount
        return UsageDelta(
            provider, model, stage, totals.calls, totals.prompt, totals.completion,
            totals.embedding, totals.estimated, cost, totals.cached,
        )  # fmt: skip

    async def aclose(self) -> None:
        """Stop the periodic writes and write what is left (shutdown). A write under way is
        let finish, not cancelled: it has taken the totals it carries, and cancelled it would
        drop them (each write is bounded by the engine's pool and statement timeouts)."""
        if self._task is not None:
            self._stop.set()
            await self._task
            self._task = None
        await self.flush()
