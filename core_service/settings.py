"""The core service's one settings object (prefix ``PINLOG_CORE_``); the only env reader.

Built once at startup and passed into constructors. Durations are seconds. Secrets have no
default. Errors name the variable and never print a value.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# ai.context_ai_state.retry_count has CHECK (retry_count BETWEEN 0 AND 3) (§1): a larger
# budget would make the rescan's increment abort its whole batch.
RETRY_COUNT_CEILING = 3


class CoreSettings(BaseSettings):
    """Core service configuration. Raises ``pydantic.ValidationError`` with precise lines."""

    model_config = SettingsConfigDict(
        env_prefix="PINLOG_CORE_", extra="ignore", frozen=True, hide_input_in_errors=True
    )

    database_url: str = Field(description="postgresql+asyncpg://user:pass@host/db")
    worker_base_url: str = Field(
        description="Base URL of the AI worker, or several comma-separated (round robin)"
    )
    internal_secret: SecretStr = Field(
        min_length=16, description="X-Internal-Secret shared with the worker (§8)"
    )
    jwt_secret: SecretStr = Field(min_length=32, description="HS256 key of member tokens")
    embedding_profile: str = Field(
        min_length=1, max_length=100, description="The worker's embedding profile (§5, §7)"
    )
    rescan_period_seconds: float = Field(default=300, gt=0, description="Rescan loop period")
    pending_expiry_seconds: float = Field(default=300, gt=0, description="PENDING is stale after")
    processing_expiry_seconds: float = Field(
        default=600, gt=0, description="PROCESSING is stale after; equal to the worker's (§2)"
    )
    max_retry: int = Field(
        default=3, ge=0, le=RETRY_COUNT_CEILING, description="Rescan dispatches per context"
    )
    batch_size: int = Field(default=100, ge=1, le=10000, description="Rows per rescan claim")
    token_ttl_seconds: int = Field(
        default=7 * 24 * 3600, ge=60, description="Lifetime of tokens made by `token`"
    )
    database_pool_size: int = Field(
        default=10, ge=1, le=200, description="Connections of one core process"
    )
    database_transaction_pooling: bool = Field(
        default=False,
        description="A transaction pooler (PgBouncer pool_mode=transaction) sits in between",
    )
    dispatch_connect_timeout_seconds: float = Field(
        default=1.0, gt=0, le=30, description="Connect timeout of a dispatch to the worker"
    )
    dispatch_read_timeout_seconds: float = Field(
        default=3.0, gt=0, le=60, description="Read timeout of a dispatch to the worker"
    )

    # Field validators, not one model validator: every problem is reported at once.
    @field_validator("database_url")
    @classmethod
    def _asyncpg_url(cls, value: str) -> str:
        if not value.startswith("postgresql+asyncpg://"):
            raise ValueError("must be a postgresql+asyncpg:// URL")
        return value

    @field_validator("worker_base_url")
    @classmethod
    def _http_urls(cls, value: str) -> str:
        urls = [url.strip().rstrip("/") for url in value.split(",")]
        if not all(url.startswith(("http://", "https://")) for url in urls):
            raise ValueError("must be http:// or https:// URLs, separated by commas")
        return ",".join(urls)

    @field_validator("internal_secret", "jwt_secret")
    @classmethod
    def _no_surrounding_space(cls, value: SecretStr) -> SecretStr:
        secret = value.get_secret_value()
        if secret != secret.strip():
            raise ValueError("has surrounding white space (a trailing newline from a file?)")
        return value

    @property
    def worker_base_urls(self) -> tuple[str, ...]:
        """The worker instances, in round-robin order."""
        return tuple(self.worker_base_url.split(","))


class LoggingSettings(BaseSettings):
    """How every ``pinlog-core`` command logs: ``json`` (one object per line, the default for
    deployments) or ``text`` (one readable line)."""

    model_config = SettingsConfigDict(env_prefix="PINLOG_CORE_", extra="ignore", frozen=True)

    log_format: Literal["json", "text"] = Field(
        default="json", description="One JSON object per line, or readable text"
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="Lowest level written"
    )


class CoreDatabaseSettings(BaseSettings):
    """Only the database URL, for commands that need nothing else (``db upgrade``)."""

    model_config = SettingsConfigDict(
        env_prefix="PINLOG_CORE_", extra="ignore", frozen=True, hide_input_in_errors=True
    )

    database_url: str
    database_transaction_pooling: bool = False


class TokenSettings(BaseSettings):
    """What ``pinlog-core token`` needs: the database and the signing key."""

    model_config = SettingsConfigDict(
        env_prefix="PINLOG_CORE_", extra="ignore", frozen=True, hide_input_in_errors=True
    )

    database_url: str
    database_transaction_pooling: bool = False
    jwt_secret: SecretStr = Field(min_length=32)
    token_ttl_seconds: int = Field(default=7 * 24 * 3600, ge=60)


def describe_errors(error: ValidationError) -> list[str]:
    """One line per problem, naming the ``PINLOG_CORE_*`` variable; never the value."""
    lines = []
    for item in error.errors(include_input=False, include_url=False):
        field = ".".join(str(part) for part in item.get("loc", ()))
        name = f"PINLOG_CORE_{field.upper()}: " if field else ""
        lines.append(f"{name}{item['msg'].removeprefix('Value error, ')}")
    return lines
