"""Provider settings: who computes vectors and who judges, where, with which model (§4, §5).

The offline providers accept only the models they ship with; the learned judge only next to
the encoder it was trained on. How long and how often a provider is called is a limit
(``app/settings/limits.py``).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import NoDecode

from app.settings.profiles import (
    MODEL_PROFILE_MAX_LENGTH,
    OFFLINE_EMBEDDING_MODEL,
    OFFLINE_PROFILE,
    USE_DIMENSION,
    USE_EMBEDDING_MODEL,
    USE_PROFILE,
    judge_profile,
    openai_judge_profile,
)
from pinlog_platform.settings_rules import refuse_placeholder


def _http_url(value: str) -> str:
    if not value.startswith(("http://", "https://")) or len(value) <= len("https://"):
        raise ValueError("must be an http:// or https:// URL")
    return value


def _key_for_openai(value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
    """An API key is required when the matching ``*_provider`` (validated before) is openai."""
    provider_field = info.field_name.replace("_api_key", "_provider")
    if info.data.get(provider_field) == "openai" and value is None:
        raise ValueError(f"is required when PINLOG_{provider_field.upper()} is openai")
    # Only the shipped placeholder: local servers (vLLM, Ollama) take dummy keys ("EMPTY").
    return value if value is None else refuse_placeholder(value)


class EmbeddingProviderSettings(BaseModel):
    """Who computes vectors; the embedding profile (validated after these) must name them."""

    embedding_provider: Literal["openai", "hashing", "use-multilingual"] = Field(
        default="openai", description="Who computes vectors: an OpenAI-compatible server or offline"
    )
    embedding_base_url: str = Field(
        default="https://api.openai.com/v1", description="OpenAI-compatible embeddings endpoint"
    )
    embedding_api_key: SecretStr | None = Field(
        default=None, description="Required for the openai provider; never logged"
    )
    embedding_model: str = Field(
        default="text-embedding-3-small", description="Model name; the profile must name it"
    )
    embedding_dimension: int = Field(
        default=1536, ge=1, le=16000, description="The model's vector length (§5)"
    )
    embedding_encoding: Literal["base64", "float"] = Field(
        default="base64",
        description="Vector wire format asked of the embedding provider: base64 (packed "
        "little-endian float32, OpenAI's own clients' default: a quarter of the bytes, parsed "
        "at C speed) or float (JSON numbers, for a provider without base64); answers are read "
        "in either format",
    )
    embedding_distance: Literal["cosine"] = Field(
        default="cosine", description="Distance of the profile (§5)"
    )
    embedding_batch_api: bool | None = Field(
        default=None,
        description="Whether the embedding provider offers OpenAI's Batch API (/v1/files, "
        "/v1/batches) for `reembed start --via batch`; unset: only for the openai provider at "
        "api.openai.com (vLLM and Ollama have none); reported as `batch` in /readyz",
    )
    batch_poll_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="Seconds between two polls of one provider batch of this worker's "
        "profile (by any worker of the profile)",
    )

    @property
    def batch_api(self) -> bool:
        """Whether this worker sends backfills by the provider's Batch API when asked."""
        if self.embedding_provider != "openai":
            return False
        if self.embedding_batch_api is not None:
            return self.embedding_batch_api
        return self.embedding_base_url.rstrip("/").startswith("https://api.openai.com/")

    @field_validator("embedding_base_url")
    @classmethod
    def _embedding_http_url(cls, value: str) -> str:
        return _http_url(value)

    @field_validator("embedding_api_key")
    @classmethod
    def _embedding_key(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        return _key_for_openai(value, info)

    @field_validator("embedding_model")
    @classmethod
    def _offline_model(cls, value: str, info: ValidationInfo) -> str:
        if info.data.get("embedding_provider") == "hashing" and value != OFFLINE_EMBEDDING_MODEL:
            raise ValueError(
                f"PINLOG_EMBEDDING_PROVIDER hashing needs PINLOG_EMBEDDING_MODEL "
                f"{OFFLINE_EMBEDDING_MODEL!r} and a profile naming it, e.g. {OFFLINE_PROFILE!r}"
            )
        if (
            info.data.get("embedding_provider") == "use-multilingual"
            and value != USE_EMBEDDING_MODEL
        ):
            raise ValueError(
                f"PINLOG_EMBEDDING_PROVIDER use-multilingual needs PINLOG_EMBEDDING_MODEL "
                f"{USE_EMBEDDING_MODEL!r} and a profile naming it, e.g. {USE_PROFILE!r}"
            )
        return value

    @field_validator("embedding_dimension")
    @classmethod
    def _offline_dimension(cls, value: int, info: ValidationInfo) -> int:
        if info.data.get("embedding_provider") == "use-multilingual" and value != USE_DIMENSION:
            raise ValueError(
                f"must be {USE_DIMENSION} for PINLOG_EMBEDDING_PROVIDER use-multilingual"
            )
        return value


FALLBACK_KEY_SETTINGS = (
    "PINLOG_JUDGE_FALLBACK_1_API_KEY",
    "PINLOG_JUDGE_FALLBACK_2_API_KEY",
    "PINLOG_JUDGE_FALLBACK_3_API_KEY",
)


class JudgeFallback(BaseModel):
    """One fallback judge: an OpenAI-compatible chat endpoint, its model, and which setting
    holds its key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str
    model: str = Field(min_length=1)
    api_key_setting: Literal[FALLBACK_KEY_SETTINGS]  # type: ignore[valid-type]

    @field_validator("base_url")
    @classmethod
    def _http(cls, value: str) -> str:
        return _http_url(value)

    @field_validator("model")
    @classmethod
    def _fits(cls, value: str) -> str:
        if len(openai_judge_profile(value)) > MODEL_PROFILE_MAX_LENGTH:
            raise ValueError(f"is too long for a {MODEL_PROFILE_MAX_LENGTH}-character profile")
        return value


class JudgeProviderSettings(BaseModel):
    """Who chooses keywords among the candidates (§4); validated after the embedding
    provider's settings, which the learned judge depends on."""

    judge_provider: Literal["openai", "similarity", "learned"] = Field(
        default="openai", description="Who chooses keywords among the candidates (§4)"
    )
    judge_base_url: str = Field(
        default="https://api.openai.com/v1", description="OpenAI-compatible chat endpoint"
    )
    judge_api_key: SecretStr | None = Field(
        default=None, description="Required for the openai judge; never logged"
    )
    judge_model: str = Field(default="gpt-4o-mini", description="Chat model of the judge")
    judge_similarity_threshold: float = Field(
        default=0.3,
        ge=-1.0,
        le=1.0,
        description="Similarity judge, and the learned judge's rule for untrained presets",
    )

    judge_batch_api: bool | None = Field(
        default=None,
        description="Whether the judge's provider offers OpenAI's Batch API (/v1/files, "
        "/v1/batches) for `reprocess keywords --via batch`; unset: only for the openai judge "
        "at api.openai.com; never with PINLOG_JUDGE_VOTES above 1 (a batch asks once); "
        "reported as `keywordBatch` in /readyz",
    )
    judge_votes: int = Field(
        default=1,
        ge=1,
        le=9,
        description="Concurrent judge calls per keyword stage, odd; a keyword is kept when a "
        "strict majority selects it (N x the judge's tokens)",
    )

    judge_fallback_1_api_key: SecretStr | None = Field(
        default=None, description="Key of a fallback judge naming it; never logged"
    )
    judge_fallback_2_api_key: SecretStr | None = Field(
        default=None, description="Key of a fallback judge naming it; never logged"
    )
    judge_fallback_3_api_key: SecretStr | None = Field(
        default=None, description="Key of a fallback judge naming it; never logged"
    )
    judge_fallbacks: Annotated[list[JudgeFallback], NoDecode] = Field(
        default=[],
        description='JSON [{"base_url": ..., "model": ..., "api_key_setting": '
        '"PINLOG_JUDGE_FALLBACK_1_API_KEY"}, ...] (up to 3): judges asked in order when the '
        "one before is unavailable, fails or answers invalidly",
    )

    @property
    def keyword_batch_api(self) -> bool:
        """Whether this worker judges a keyword reprocess by the judge provider's Batch API
        when asked (one ask per note: not with votes)."""
        if self.judge_provider != "openai" or self.judge_votes != 1:
            return False
        if self.judge_batch_api is not None:
            return self.judge_batch_api
        return self.judge_base_url.rstrip("/").startswith("https://api.openai.com/")

    @field_validator("judge_fallbacks", mode="before")
    @classmethod
    def _fallbacks_json(cls, value: Any) -> Any:
        if isinstance(value, str):
            if not value.strip():
                return []
            try:
                return json.loads(value)
            except ValueError:
                raise ValueError("must be a JSON list of fallback judges") from None
        return value

    @field_validator("judge_fallbacks")
    @classmethod
    def _fallback_keys_given(
        cls, value: list[JudgeFallback], info: ValidationInfo
    ) -> list[JudgeFallback]:
        for fallback in value:
            field = fallback.api_key_setting.removeprefix("PINLOG_").lower()
            if info.data.get(field) is None:
                raise ValueError(f"names {fallback.api_key_setting}, which is not set")
        return value

    @field_validator("judge_votes")
    @classmethod
    def _odd_votes(cls, value: int) -> int:
        if value % 2 == 0:
            raise ValueError("must be odd (a strict majority must exist)")
        return value

    @field_validator("judge_provider")
    @classmethod
    def _learned_needs_its_encoder(cls, value: str, info: ValidationInfo) -> str:
        if value == "learned" and info.data.get("embedding_provider") != "use-multilingual":
            # The judge was trained on that encoder's vectors and embeds the note with it.
            raise ValueError("learned needs PINLOG_EMBEDDING_PROVIDER use-multilingual")
        return value

    @field_validator("judge_base_url")
    @classmethod
    def _judge_http_url(cls, value: str) -> str:
        return _http_url(value)

    @field_validator("judge_api_key")
    @classmethod
    def _judge_key(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        return _key_for_openai(value, info)

    @field_validator("judge_model")
    @classmethod
    def _judge_profile_fits(cls, value: str, info: ValidationInfo) -> str:
        if (
            info.data.get("judge_provider") == "openai"
            and len(openai_judge_profile(value)) > MODEL_PROFILE_MAX_LENGTH
        ):
            raise ValueError(
                f"is too long: the judge profile must fit {MODEL_PROFILE_MAX_LENGTH} "
                "characters (ai.context_keyword_analysis)"
            )
        return value

    @property
    def judge_profile(self) -> str:
        """Which judge decided, stored as ``model_profile`` with each analysis row (§4)."""
        return judge_profile(
            self.judge_provider,
            model=self.judge_model,
            similarity_threshold=self.judge_similarity_threshold,
        )
