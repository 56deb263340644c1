"""``ai.provider_usage_daily``: the persisted token and cost ledger.

Rows are added to, never replaced: ``add_usage`` upserts one row per (day, provider, model,
stage) with the day taken on the database clock (UTC), so several processes sum up. The one
subtraction is ``release_estimates``: what a provider batch's estimate counted above the
tokens its results report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection


@dataclass(frozen=True, slots=True)
class UsageDelta:
    """What one process adds to one ledger row; ``cost_usd`` ``None``: the model has no
    price; ``cached_prompt_tokens``: the part of the prompt (or embedding) tokens the provider
    read from its prompt cache."""

    provider: str
    model: str
    stage: str
    calls: int
    prompt_tokens: int
    completion_tokens: int
    embedding_tokens: int
    estimated_tokens: int
    cost_usd: Decimal | None
    cached_prompt_tokens: int = 0


_ADD_USAGE = text(
    """
    INSERT INTO ai.provider_usage_daily AS t (
        day, provider, model, stage, calls, prompt_tokens, completion_tokens, embedding_tokens,
        estimated_tokens, cost_usd, cached_prompt_tokens, updated_at)
    VALUES (
        (now() AT TIME ZONE 'UTC')::date, :provider, :model, :stage, :calls, :prompt_tokens,
        :completion_tokens, :embedding_tokens, :estimated_tokens, :cost_usd,
        :cached_prompt_tokens, now())
    ON CONFLICT (day, provider, model, stage) DO UPDATE SET
        calls = t.calls + excluded.calls,
        prompt_tokens = t.prompt_tokens + excluded.prompt_tokens,
        completion_tokens = t.completion_tokens + excluded.completion_tokens,
        embedding_tokens = t.embedding_tokens + excluded.embedding_tokens,
        estimated_tokens = t.estimated_tokens + excluded.estimated_tokens,
        cached_prompt_tokens = t.cached_prompt_tokens + excluded.cached_prompt_tokens,
        cost_usd = CASE WHEN excluded.cost_usd IS NULL THEN t.cost_usd
                        ELSE coalesce(t.cost_usd, 0) + excluded.cost_usd END,
        updated_at = now()
    """
)

# Estimated tokens a settled batch did not use, taken back from the row they were added to:
# the batch's submission day (its estimate is written within a flush interval of it), never
# below zero (an estimate written after midnight stays on the next day's row).
_RELEASE_ESTIMATE = text(
    """
    UPDATE ai.provider_usage_daily AS t SET
        prompt_tokens = t.prompt_tokens - least(t.prompt_tokens, CAST(:prompt_tokens AS bigint)),
        embedding_tokens = t.embedding_tokens
            - least(t.embedding_tokens, CAST(:embedding_tokens AS bigint)),
        estimated_tokens = t.estimated_tokens
            - least(t.estimated_tokens, CAST(:estimated_tokens AS bigint)),
        cost_usd = CASE WHEN t.cost_usd IS NULL OR CAST(:cost_usd AS numeric) IS NULL
                        THEN t.cost_usd
                        ELSE greatest(t.cost_usd - CAST(:cost_usd AS numeric), 0) END,
        updated_at = now()
    FROM ai.provider_batch AS b
    WHERE b.batch_id = :batch_id
      AND t.day = (b.submitted_at AT TIME ZONE 'UTC')::date
      AND t.provider = :provider AND t.model = :model AND t.stage = :stage
    """
)

_TOKENS_TODAY = text(
    """
    SELECT coalesce(sum(prompt_tokens + completion_tokens + embedding_tokens), 0)
    FROM ai.provider_usage_daily
    WHERE day = (now() AT TIME ZONE 'UTC')::date AND provider = :provider
    """
)


async def add_usage(conn: AsyncConnection, deltas: Sequence[UsageDelta]) -> None:
    """Add ``deltas`` to today's rows (one statement per row, in one transaction)."""
    if deltas:
        await conn.execute(
            _ADD_USAGE,
            [
                {
                    "provider": d.provider,
                    "model": d.model,
                    "stage": d.stage,
                    "calls": d.calls,
                    "prompt_tokens": d.prompt_tokens,
                    "completion_tokens": d.completion_tokens,
                    "embedding_tokens": d.embedding_tokens,
                    "estimated_tokens": d.estimated_tokens,
                    "cost_usd": d.cost_usd,
                    "cached_prompt_tokens": d.cached_prompt_tokens,
                }
                for d in deltas
            ],
        )


@dataclass(frozen=True, slots=True)
class UsageRelease:
    """What a settled batch takes back from the row of the day ``batch_id`` was submitted:
    the tokens its estimate counted above its real count (``prompt_tokens`` for chat,
    ``embedding_tokens`` for embeddings) and their cost, and its whole estimate from
    ``estimated_tokens`` (the results counted them)."""

    batch_id: str
    provider: str
    model: str
    stage: str
    prompt_tokens: int
    embedding_tokens: int
    estimated_tokens: int
    cost_usd: Decimal | None


async def release_estimates(conn: AsyncConnection, releases: Sequence[UsageRelease]) -> None:
    """Take ``releases`` back from their rows (one statement per release, in the caller's
    transaction); a row already below a release is left at zero, never negative."""
    if releases:
        await conn.execute(
            _RELEASE_ESTIMATE,
            [
                {
                    "batch_id": r.batch_id,
                    "provider": r.provider,
                    "model": r.model,
                    "stage": r.stage,
                    "prompt_tokens": r.prompt_tokens,
                    "embedding_tokens": r.embedding_tokens,
                    "estimated_tokens": r.estimated_tokens,
                    "cost_usd": r.cost_usd,
                }
                for r in releases
            ],
        )


async def tokens_today(conn: AsyncConnection, provider: str) -> int:
    """Every process's flushed tokens of ``provider`` today (UTC, database clock)."""
    return int((await conn.execute(_TOKENS_TODAY, {"provider": provider})).scalar_one())
