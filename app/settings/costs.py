"""Cost settings: the price table of the usage ledger, how often it is
written, and the daily token caps of the spend guard.

Prices are USD per million tokens, by model and kind (``prompt``, ``completion`` for chat;
``embedding`` for embeddings; ``cached_prompt`` for the prompt or embedding input tokens the
provider read from its prompt cache, ``usage.prompt_tokens_details.cached_tokens``: a part of
the prompt billed at this price instead of ``prompt``/``embedding``; when a model's object
leaves it out it is the model's ``prompt`` (or ``embedding``) price, so an unknown cache
discount never under-states a cost). ``PINLOG_PROVIDER_PRICES`` (JSON) adds models to, or replaces
models of, ``DEFAULT_PRICES``; a model in neither is counted in tokens only (its cost stays
NULL in the ledger).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import NoDecode

# OpenAI's list prices (USD per 1M tokens, standard tier) of the default models and their
# siblings, as published on 2024-08-06 (the gpt-4o-2024-08-06 price change) and unchanged
# through 2025; check https://openai.com/api/pricing before relying on a bill estimate.
# Cached input (prompt caching, announced 2024-10-01): 50 % of the input price for gpt-4o-mini
# (0.075) and gpt-4o (1.25); the embedding models have no cached-input price (their input
# price). The Batch API (announced 2024-04-15): 50 % of the synchronous prices (BATCH_DISCOUNT).
PRICES_DATE = "2024-08-06"
CACHED_PRICES_DATE = "2024-10-01"
BATCH_DISCOUNT = 0.5


class ModelPrice(BaseModel):
    """USD per million tokens of one model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt: float = Field(default=0.0, ge=0)
    completion: float = Field(default=0.0, ge=0)
    embedding: float = Field(default=0.0, ge=0)
    cached_prompt: float | None = Field(default=None, ge=0)

    @property
    def cached_prompt_price(self) -> float:
        """USD per million cached prompt tokens: ``cached_prompt``, else the ``prompt`` price
        for chat models and the ``embedding`` price for embedding models (no discount)."""
        if self.cached_prompt is not None:
            return self.cached_prompt
        return self.prompt if self.prompt else self.embedding


DEFAULT_PRICES: dict[str, ModelPrice] = {
    "text-embedding-3-small": ModelPrice(embedding=0.02),
    "text-embedding-3-large": ModelPrice(embedding=0.13),
    "gpt-4o-mini": ModelPrice(prompt=0.15, completion=0.60, cached_prompt=0.075),
    "gpt-4o": ModelPrice(prompt=2.50, completion=10.00, cached_prompt=1.25),
}


class CostSettings(BaseModel):
    """The price table and the ledger's write interval."""

    # NoDecode: the JSON is parsed by the validator below, so a malformed value is one
    # settings problem naming the variable (exit 2), not an exception of the settings source.
    provider_prices: Annotated[dict[str, ModelPrice], NoDecode] = Field(
        default={},
        description='JSON {"model": {"prompt": usd_per_million, "completion": ..., '
        '"embedding": ..., "cached_prompt": ...}}, added to the defaults '
        "(text-embedding-3-small/-large, gpt-4o-mini, gpt-4o at OpenAI's list prices of "
        f"{PRICES_DATE}; cached input of gpt-4o-mini and gpt-4o at 50 % of their prompt price, "
        f"as of {CACHED_PRICES_DATE}); cached_prompt prices the prompt tokens the provider read "
        "from its prompt cache (absent: the prompt price, or the embedding price of an "
        "embedding model); a model without a price counts tokens only",
    )
    provider_batch_discount: float = Field(
        default=BATCH_DISCOUNT,
        gt=0,
        le=1,
        description="The factor of the synchronous prices at which Batch API work is priced "
        "(OpenAI: 0.5, half price); for bulk work sent by batch",
    )
    usage_flush_seconds: float = Field(
        default=5.0,
        gt=0,
        le=60,
        description="Seconds between the usage ledger's writes (one per process; at most this "
        "much accounting is lost on SIGKILL)",
    )

    embedding_daily_token_cap: int = Field(
        default=0,
        ge=0,
        description="Embedding tokens per UTC day (every replica's, from the ledger) after "
        "which the embedding provider is unavailable until the next UTC day; 0: no cap",
    )
    judge_daily_token_cap: int = Field(
        default=0,
        ge=0,
        description="Judge tokens (prompt + completion) per UTC day after which the judge is "
        "unavailable until the next UTC day; 0: no cap",
    )

    @field_validator("provider_prices", mode="before")
    @classmethod
    def _json_object(cls, value: Any) -> Any:
        if isinstance(value, str):
            if not value.strip():
                return {}  # set but empty: the defaults alone
            try:
                return json.loads(value)
            except ValueError:
                raise ValueError("must be a JSON object of model prices") from None
        return value

    @property
    def prices(self) -> dict[str, ModelPrice]:
        """The effective price table: the defaults with ``provider_prices`` over them."""
        return {**DEFAULT_PRICES, **self.provider_prices}
