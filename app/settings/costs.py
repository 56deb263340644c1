"""Cost settings: the price table of the usage ledger, how often it is
written, and the daily token caps of the spend guard.

Prices are USD per million tokens, by model and kind (``prompt``, ``completion`` for chat;
``embedding`` for embeddings). ``PINLOG_PROVIDER_PRICES`` (JSON) adds models to, or replaces
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
PRICES_DATE = "2024-08-06"


class ModelPrice(BaseModel):
    """USD per million tokens of one model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt: float = Field(default=0.0, ge=0)
    completion: float = Field(default=0.0, ge=0)
    embedding: float = Field(default=0.0, ge=0)


DEFAULT_PRICES: dict[str, ModelPrice] = {
    "text-embedding-3-small": ModelPrice(embedding=0.02),
    "text-embedding-3-large": ModelPrice(embedding=0.13),
    "gpt-4o-mini": ModelPrice(prompt=0.15, completion=0.60),
    "gpt-4o": ModelPrice(prompt=2.50, completion=10.00),
}


class CostSettings(BaseModel):
    """The price table and the ledger's write interval."""

    # NoDecode: the JSON is parsed by the validator below, so a malformed value is one
    # settings problem naming the variable (exit 2), not an exception of the settings source.
    provider_prices: Annotated[dict[str, ModelPrice], NoDecode] = Field(
        default={},
        description='JSON {"model": {"prompt": usd_per_million, "completion": ..., '
        '"embedding": ...}}, added to the defaults (text-embedding-3-small/-large, gpt-4o-mini, '
        f"gpt-4o at OpenAI's list prices of {PRICES_DATE}); a model without a price counts "
        "tokens only",
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
