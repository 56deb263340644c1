"""The core service's one settings object (prefix ``PINLOG_CORE_``); the only env reader.

Built once at startup and passed into constructors. Durations are seconds. Secrets have no
default. Errors name the variable and never print a value.
"""

from __future__ import annotations

import ipaddress

from pydantic import Field, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from pinlog_platform.contract.search import SearchCuts, default_cuts
from pinlog_platform.settings_rules import (
    GENERATED_SECRET_MIN_LENGTH,
    check_database_url,
    check_generated_secret,
    logging_settings,
    refuse_empty_or_padded,
    refuse_placeholder_password,
    tracing_settings,
)
from pinlog_platform.settings_rules.http_serving import HttpServingSettings

# Every core setting is read from PINLOG_CORE_<FIELD>.
ENV_PREFIX = "PINLOG_CORE_"

INTERNAL_SECRET_MIN_LENGTH = GENERATED_SECRET_MIN_LENGTH
JWT_SECRET_MIN_LENGTH = GENERATED_SECRET_MIN_LENGTH
DEFAULT_TOKEN_TTL_SECONDS = 7 * 24 * 3600
# The longest duration a setting hands PostgreSQL as an interval (ten years): beyond, a
# statement could fail with a data exception on every run instead of at startup.
MAX_SQL_SECONDS = 10 * 365 * 24 * 3600
# The smallest body cap that still admits every request valid after normalisation, even with
# each character sent as an escaped surrogate pair (12 bytes): 500 + 100 + 200 characters.
MAX_REQUEST_BYTES_FLOOR = 16 * 1024


# ai.context_ai_state.retry_count has CHECK (retry_count BETWEEN 0 AND 3) (§1): a larger
# budget would make the rescan's increment abort its whole batch.
RETRY_COUNT_CEILING = 3


DEFAULT_DNS_PORT = 53


def parse_dns_servers(value: str) -> tuple[tuple[str, int], ...]:
    """``PINLOG_CORE_WORKER_DNS_SERVERS`` (comma-separated ``IP``, ``IP:PORT``, ``[IPv6]:PORT``)
    as ``(address, port)`` pairs; ``ValueError`` naming the rule (never the value)."""
    servers = []
    for item in value.split(","):
        item = item.strip()
        host, port = item, DEFAULT_DNS_PORT
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            if rest:
                if not rest.startswith(":") or not rest[1:].isdigit():
                    raise ValueError("must be IP or IP:PORT addresses, comma-separated")
                port = int(rest[1:])
        elif item.count(":") == 1:
            host, _, port_text = item.partition(":")
            if not port_text.isdigit():
                raise ValueError("must be IP or IP:PORT addresses, comma-separated")
            port = int(port_text)
        if not _is_ip(host) or not 0 < port < 65536:
            raise ValueError("must be IP or IP:PORT addresses, comma-separated")
        servers.append((host, port))
    return tuple(servers)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _given(value: float | None, default: float) -> float:
    return default if value is None else value


class CoreDatabaseSettings(BaseSettings):
    """The database the core service uses; alone for ``db upgrade``, and the base of every
    other settings class of the core (one set of rules for the shared fields)."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, extra="ignore", frozen=True, hide_input_in_errors=True
    )

    database_url: str = Field(
        description="postgresql+asyncpg://user:pass@host/db; several hosts (a primary and its "
        "standbys) as postgresql+asyncpg://user:pass@/db?host=HOST1:PORT&host=HOST2:PORT"
        "&target_session_attrs=read-write (docs/deployment.md)"
    )
    database_transaction_pooling: bool = Field(
        default=False,
        description="A transaction pooler (PgBouncer pool_mode=transaction) sits in between",
    )

    # Field validators, not one model validator: every problem is reported at once.
    @field_validator("*", mode="before")
    @classmethod
    def _no_surrounding_space(cls, value: object) -> object:
        return refuse_empty_or_padded(value)

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str) -> str:
        return refuse_placeholder_password(check_database_url(value))


class TokenSettings(CoreDatabaseSettings):
    """What ``pinlog-core token`` needs: the database and the signing keys (rotation:
    docs/operations.md "Signing keys")."""

    jwt_secret: SecretStr = Field(
        description="HS256 key that signs member tokens (the current key); generated: "
        ">= 32 characters, >= 10 distinct, not a placeholder of .env.example"
    )
    jwt_previous_secrets: SecretStr | None = Field(
        default=None,
        description="Earlier signing keys, comma-separated: tokens they signed still verify "
        "(each validated like the current key)",
    )
    token_ttl_seconds: int = Field(
        default=DEFAULT_TOKEN_TTL_SECONDS,
        ge=60,
        le=MAX_SQL_SECONDS,
        description="Lifetime of tokens made by `token`",
    )
    token_max_lifetime_seconds: int = Field(
        default=DEFAULT_TOKEN_TTL_SECONDS,
        ge=60,
        le=MAX_SQL_SECONDS,
        description="A token claiming to live longer than this from now is refused; at least "
        "PINLOG_CORE_TOKEN_TTL_SECONDS",
    )

    @field_validator("jwt_secret")
    @classmethod
    def _jwt_secret(cls, value: SecretStr | None) -> SecretStr | None:
        # None only in RescanSettings, where the key is optional.
        return None if value is None else check_generated_secret(value)

    @field_validator("jwt_previous_secrets", mode="before")
    @classmethod
    def _empty_means_none(cls, value: object) -> object:
        # Compose passes ${PINLOG_CORE_JWT_PREVIOUS_SECRETS:-}: empty outside a rotation.
        return None if value == "" else value

    @field_validator("jwt_previous_secrets")
    @classmethod
    def _previous_secrets(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            for secret in value.get_secret_value().split(","):
                check_generated_secret(SecretStr(secret.strip()))
        return value

    @field_validator("token_max_lifetime_seconds")
    @classmethod
    def _cap_covers_ttl(cls, value: int, info: ValidationInfo) -> int:
        ttl = info.data.get("token_ttl_seconds")
        if ttl is not None and value < ttl:
            raise ValueError("must be at least PINLOG_CORE_TOKEN_TTL_SECONDS")
        return value

    @property
    def previous_jwt_secrets(self) -> tuple[str, ...]:
        """The previous keys, in the order given; empty when none."""
        if self.jwt_previous_secrets is None:
            return ()
        raw = self.jwt_previous_secrets.get_secret_value()
        return tuple(secret.strip() for secret in raw.split(","))


class StateClockSettings(CoreDatabaseSettings):
    """The expiries the core judges state rows by; alone for ``status``."""

    pending_expiry_seconds: float = Field(
        default=300, gt=0, le=MAX_SQL_SECONDS, description="PENDING is stale after"
    )
    processing_expiry_seconds: float = Field(
        default=600,
        gt=0,
        le=MAX_SQL_SECONDS,
        description="PROCESSING is stale after; equal to the worker's (§2)",
    )


class CoreSettings(HttpServingSettings, TokenSettings, StateClockSettings):
    """Core service configuration. Raises ``pydantic.ValidationError`` with precise lines."""

    worker_base_url: str = Field(
        description="Base URL of the AI worker, or several comma-separated (round robin); a "
        "host that is a DNS name stands for every address it resolves to (docs/scaling.md)"
    )
    internal_secret: SecretStr = Field(
        description="X-Internal-Secret shared with the worker (§8); generated: >= 32 characters, "
        ">= 10 distinct, not a placeholder of .env.example"
    )
    embedding_profile: str = Field(
        min_length=1, max_length=100, description="The worker's embedding profile (§5, §7)"
    )
    otel_trust_client_traceparent: bool = Field(
        default=False,
        description="Continue a client's traceparent on the client API (off: a request starts "
        "its own trace, linked to the client's)",
    )
    rescan_period_seconds: float = Field(default=300, gt=0, description="Rescan loop period")
    max_retry: int = Field(
        default=3,
        ge=0,
        le=RETRY_COUNT_CEILING,
        description="Accepted re-requests per context after its first (docs/rescan.md Budget)",
    )
    batch_size: int = Field(default=100, ge=1, le=10000, description="Rows per rescan claim")
    database_pool_size: int = Field(
        default=10, ge=1, le=200, description="Connections of one core process"
    )
    dispatch_connect_timeout_seconds: float = Field(
        default=1.0, gt=0, le=30, description="Connect timeout of a dispatch to the worker"
    )
    dispatch_read_timeout_seconds: float = Field(
        default=3.0, gt=0, le=60, description="Read timeout of a dispatch to the worker"
    )
    dispatch_retry_capacity: int = Field(
        default=10_000,
        ge=0,
        le=1_000_000,
        description="Refused dispatches one core process holds to send again; beyond, the "
        "rescan takes them (docs/rescan.md Backlog)",
    )
    status_refresh_seconds: float = Field(
        default=15,
        ge=1,
        le=3600,
        description="How often each core process recomputes the status gauges (one statement)",
    )
    dispatch_backoff_max_seconds: float = Field(
        default=30,
        ge=1,
        le=300,
        description="Longest wait after a refusal without Retry-After (from 1 s, doubling)",
    )
    max_request_bytes: int = Field(
        default=64 * 1024,
        ge=MAX_REQUEST_BYTES_FLOOR,
        le=1024 * 1024,
        description="Larger request bodies answer 413, before or while they arrive",
    )

    member_writes_per_minute: int = Field(
        default=600,
        ge=0,
        description="Client API writes (and exports) per member and minute; 0 = off",
    )
    member_searches_per_minute: int = Field(
        default=600, ge=0, description="Searches per member and minute; 0 = off"
    )
    member_burst: int = Field(
        default=200, ge=0, description="Writes or searches a member may make at once; 0 = off"
    )
    member_daily_notes: int = Field(
        default=0,
        ge=0,
        le=1_000_000,
        description=(
            "Notes a member may make per UTC day (creates, added contexts, edits that write a "
            "new context); 0 = off"
        ),
    )
    ops_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Port of the operations listener (/metrics, detailed /readyz); none when unset",
    )
    ops_host: str = Field(
        default="127.0.0.1", description="Interface of the operations listener (loopback)"
    )
    search_similarity_floor: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Client search: results below this cosine are not shown; 0 = off "
        "(default: 0.30, or as measured for the embedding profile, docs/offline-encoder.md)",
    )
    search_similarity_floor_word: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Client search: the floor for a one-word query of <= 5 characters; 0 = off "
        "(default: 0.24, or as measured for the embedding profile)",
    )
    search_top_ratio: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="Client search: results below this share of the best one's cosine are not "
        "shown; 0 = off (default: 0.60, or as measured for the embedding profile)",
    )

    search_database_url: str | None = Field(
        default=None,
        description="Where client search reads its own lexical list: a streaming replica "
        "(postgresql+asyncpg://, every rule of PINLOG_CORE_DATABASE_URL); the ownership and "
        "deletion re-check, writes and claims stay on PINLOG_CORE_DATABASE_URL. Unset: that one",
    )
    worker_dns_servers: str | None = Field(
        default=None,
        description="DNS servers that resolve the worker names of WORKER_BASE_URL "
        "(comma-separated IP or IP:PORT); unset: the system resolver (getaddrinfo)",
    )
    worker_dns_refresh_seconds: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description="How often worker names are resolved again (also soon after an address "
        "could not be reached): a new worker gets work, a removed one stops getting it",
    )
    serve_openapi: bool = Field(
        default=False,
        description="Serve the client API's OpenAPI document at GET /api/v1/openapi.json "
        "(no token needed; the same document as docs/openapi/core-client.json)",
    )

    @field_validator("worker_base_url")
    @classmethod
    def _http_urls(cls, value: str) -> str:
        urls = [url.strip().rstrip("/") for url in value.split(",")]
        if not all(url.startswith(("http://", "https://")) for url in urls):
            raise ValueError("must be http:// or https:// URLs, separated by commas")
        return ",".join(urls)

    @field_validator("internal_secret")
    @classmethod
    def _internal_secret(cls, value: SecretStr) -> SecretStr:
        return check_generated_secret(value)

    @field_validator("worker_dns_servers")
    @classmethod
    def _dns_servers(cls, value: str | None) -> str | None:
        if value is not None:
            parse_dns_servers(value)
        return value

    @property
    def worker_dns_server_addresses(self) -> tuple[tuple[str, int], ...]:
        """``WORKER_DNS_SERVERS`` as ``(address, port)`` pairs; empty when unset."""
        return () if self.worker_dns_servers is None else parse_dns_servers(self.worker_dns_servers)

    @field_validator("search_database_url")
    @classmethod
    def _search_database_url(cls, value: str | None) -> str | None:
        return None if value is None else refuse_placeholder_password(check_database_url(value))

    @property
    def search_cuts(self) -> SearchCuts:
        """The client search's cuts under the configured profile (``search_cuts_for``)."""
        return self.search_cuts_for(self.embedding_profile)

    def search_cuts_for(self, profile: str) -> SearchCuts:
        """The client search's cuts under ``profile``: each setting given, else the
        profile's default (``pinlog_platform.contract.search.default_cuts``)."""
        default = default_cuts(profile)
        return SearchCuts(
            floor=_given(self.search_similarity_floor, default.floor),
            floor_word=_given(self.search_similarity_floor_word, default.floor_word),
            top_ratio=_given(self.search_top_ratio, default.top_ratio),
        )

    @property
    def worker_base_urls(self) -> tuple[str, ...]:
        """The worker instances, in round-robin order."""
        return tuple(self.worker_base_url.split(","))


class ProfileInUseSettings(CoreDatabaseSettings):
    """The database and the embedding profile in use: what ``reprocess keywords --dry-run``
    reads (it only counts; no worker, no secret)."""

    embedding_profile: str = CoreSettings.model_fields["embedding_profile"]


class RescanSettings(CoreSettings):
    """What ``rescan --once``, ``retry-failed`` and ``reprocess keywords`` read:
    ``CoreSettings`` but the signing key of member tokens, which only ``serve`` and ``token``
    use (validated when given)."""

    jwt_secret: SecretStr | None = Field(
        default=None, description="HS256 key of member tokens; unused by rescan"
    )


# How every ``pinlog-core`` command logs (``PINLOG_CORE_LOG_FORMAT``, ``PINLOG_CORE_LOG_LEVEL``).
LoggingSettings = logging_settings(ENV_PREFIX)
# Where every `pinlog-core` command exports traces (`PINLOG_CORE_OTEL_EXPORTER_OTLP_ENDPOINT`).
TracingSettings = tracing_settings(ENV_PREFIX)
