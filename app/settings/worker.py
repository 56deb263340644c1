"""The worker's settings classes (prefix ``PINLOG_``): ``Settings`` assembled from its parts,
and the smaller classes of the commands that need less.

Built once at startup and passed into constructors. Validators fail startup on contradictions
(CONTRACT §5: the profile string must agree with model, dimension and distance) and on missing
secrets. Durations are seconds.
"""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    Field,
    SecretStr,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.settings.costs import CostSettings
from app.settings.limits import LimitSettings
from app.settings.profiles import OFFLINE_DEFAULTS, ProfileSettings
from app.settings.providers import EmbeddingProviderSettings, JudgeProviderSettings
from pinlog_platform.settings_rules import (
    GENERATED_SECRET_MIN_LENGTH,
    check_database_url,
    check_generated_secret,
    is_empty,
    logging_settings,
    refuse_empty_or_padded,
    refuse_placeholder_password,
    tracing_settings,
)
from pinlog_platform.settings_rules.http_serving import HttpServingSettings

# Every worker setting is read from PINLOG_<FIELD>.
ENV_PREFIX = "PINLOG_"

INTERNAL_SECRET_MIN_LENGTH = GENERATED_SECRET_MIN_LENGTH

# Empty values (``PINLOG_X=``, as templates and ``${X:-}`` produce them), decided per setting:
# numeric settings (``_EMPTY_MEANS_DEFAULT``, below ``Settings``) mean "the default"; API keys
# mean "not set" (then required for the openai provider); everything else (URLs, secrets,
# names, choices, the profile) is refused, so that an empty endpoint can never silently become
# api.openai.com and an empty name never a guessed one. tests/unit pins each group.
_EMPTY_MEANS_UNSET = frozenset(
    {
        "embedding_api_key",
        "judge_api_key",
        "judge_fallback_1_api_key",
        "judge_fallback_2_api_key",
        "judge_fallback_3_api_key",
    }
)


class DeploymentSettings(BaseModel):
    """Where the database is, the shared secret, online or offline; and the rules every value
    of ``Settings`` follows (empty and padded values, the offline switch)."""

    database_url: str = Field(
        description="SQLAlchemy asyncpg URL, postgresql+asyncpg://user:pass@host/db; several "
        "hosts (a primary and its standbys) as postgresql+asyncpg://user:pass@/db?host=HOST1:PORT"
        "&host=HOST2:PORT&target_session_attrs=read-write (docs/deployment.md)"
    )
    search_database_url: str | None = Field(
        default=None,
        description="Where internal search (§7) reads: a streaming replica (every rule of "
        "PINLOG_DATABASE_URL); stage claims and saves, presets and readiness stay on "
        "PINLOG_DATABASE_URL. Unset: that one",
    )
    internal_secret: SecretStr = Field(
        description="Shared X-Internal-Secret value (§8); generated: >= 32 characters, >= 10 "
        "distinct, not a placeholder of .env.example"
    )
    offline: bool = Field(
        default=False, description="Select the offline embedder and judge (OFFLINE_DEFAULTS)"
    )
    database_transaction_pooling: bool = Field(
        default=False,
        description="A transaction pooler (PgBouncer pool_mode=transaction) sits in between",
    )
    otel_traceparent_to_providers: bool = Field(
        default=False,
        description="Send traceparent on embedding and judge calls while traces are exported "
        "(off: a provider learns nothing of our traces)",
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
        return refuse_placeholder_password(check_database_url(value))

    @field_validator("search_database_url")
    @classmethod
    def _search_database_url(cls, value: str | None) -> str | None:
        return None if value is None else refuse_placeholder_password(check_database_url(value))

    @field_validator("internal_secret")
    @classmethod
    def _long_secret(cls, value: SecretStr | None) -> SecretStr | None:
        # None only in ToolSettings, where the secret is optional.
        if value is None:
            return value
        return check_generated_secret(value)


class Settings(
    HttpServingSettings,
    CostSettings,
    LimitSettings,
    JudgeProviderSettings,
    ProfileSettings,
    EmbeddingProviderSettings,
    DeploymentSettings,
    BaseSettings,
):
    """Worker configuration; every setting is validated at startup and every problem is
    reported at once (one ``pydantic.ValidationError`` item per problem, naming the field;
    ``describe_errors`` renders them). Cross-field rules are field validators reading the
    fields declared before them, so they run even when an unrelated field is wrong.

    Fields are declared, validated and reported in the reverse order of the bases:
    deployment, embedding provider, profile, judge, limits, costs, HTTP serving; each part's
    rules read only fields of the parts before it.
    """

    # hide_input_in_errors: a validation error must never print a secret back.
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="ignore",
        frozen=True,
        hide_input_in_errors=True,
        validate_default=True,
    )


_EMPTY_MEANS_DEFAULT = frozenset(
    name
    for name, field in Settings.model_fields.items()
    if field.annotation in (int, float, int | None)
) | {"provider_prices", "judge_fallbacks"}  # empty: the defaults


class ToolSettings(Settings):
    """``Settings`` for the commands that serve no HTTP (``presets load``, ``doctor``): the
    internal secret guards the API only, so it may be unset here (validated when given)."""

    internal_secret: SecretStr | None = Field(
        default=None, description="Shared X-Internal-Secret value (§8); unused by these commands"
    )


class SmokeSettings(ToolSettings):
    """What ``smoke`` reads: the providers and the profile. It never contacts the database,
    so ``PINLOG_DATABASE_URL`` is optional (validated when given)."""

    database_url: str | None = Field(
        default=None, description="Unused by smoke; validated when given"
    )

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str | None) -> str | None:
        return None if value is None else check_database_url(value)


# How every ``pinlog-ai`` command logs (``PINLOG_LOG_FORMAT``, ``PINLOG_LOG_LEVEL``).
LoggingSettings = logging_settings(ENV_PREFIX)
# Where every `pinlog-ai` command exports traces (`PINLOG_OTEL_EXPORTER_OTLP_ENDPOINT`).
TracingSettings = tracing_settings(ENV_PREFIX)


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


class DoctorSettings(MigrationSettings):
    """What ``doctor`` reads: the database, the profile and column dimension it checks, and
    the expiry that makes a PROCESSING stage stale (``PINLOG_OFFLINE=true`` selects the offline
    profile, as for ``Settings``). No provider settings, no secret: doctor calls nobody."""

    offline: bool = DeploymentSettings.model_fields["offline"]
    embedding_profile: str = ProfileSettings.model_fields["embedding_profile"]
    vector_dimension: int = ProfileSettings.model_fields["vector_dimension"]
    processing_expiry_seconds: int = LimitSettings.model_fields["processing_expiry_seconds"]

    @model_validator(mode="before")
    @classmethod
    def _apply_offline_switch(cls, data: Any) -> Any:
        return DeploymentSettings._apply_offline_switch(data)


class DatabaseSettings(BaseSettings):
    """Only the database URL (and the demo's optional secret), for commands that need
    nothing else (``db upgrade``, demo)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="ignore", frozen=True, hide_input_in_errors=True
    )

    database_url: str | None = None
    internal_secret: SecretStr | None = None
    database_transaction_pooling: bool = False
