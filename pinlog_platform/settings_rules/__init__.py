"""Rules both services' settings follow, with one message each (settings errors name the
variable and never print a value).

- ``refuse_empty_or_padded``: a set value that is empty, or has surrounding white space (a
  secret read from a file with its newline), is refused;
- ``check_database_url``: a ``postgresql+asyncpg://`` URL with something after the scheme;
  several hosts only in the one accepted form (``database_hosts``, ``SEVERAL_HOSTS_FORM``);
- ``check_secret_length``: a secret at least ``minimum`` characters long;
- ``refuse_placeholder``: a secret that is one of the placeholders shipped in ``.env.example``
  (``SHIPPED_PLACEHOLDERS``) is refused, for every secret of both services;
- ``check_generated_secret``: a secret this project has the operator generate (the internal
  secret, the signing keys) is not a placeholder, has at least ``GENERATED_SECRET_MIN_LENGTH``
  characters and ``GENERATED_SECRET_MIN_DISTINCT`` distinct ones (``openssl rand -hex 32`` and
  ``openssl rand -base64 48`` pass);
- ``refuse_placeholder_password``: a database URL whose password is a shipped placeholder, or
  weak when any of its hosts is not on loopback;
- ``describe_errors``: one line per problem, naming the ``{prefix}*`` variable;
- ``logging_settings``: the log format and level settings class for a prefix;
- ``tracing_settings``: the trace export settings class for a prefix.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import parse_qs, unquote, urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DATABASE_URL_SCHEME = "postgresql+asyncpg://"
EMPTY_VALUE = "is set but empty; give a value or unset it"
PADDED_VALUE = "has leading or trailing whitespace (a newline from a file?); remove it"
DATABASE_URL_RULE = "must be a postgresql+asyncpg:// URL"
# Several hosts (a primary and its standbys, for failover): the one form both services accept,
# SQLAlchemy's multi-host form, which the worker's stage pool reads the same way
# (pinlog_platform.db.connection.driver_target; docs/deployment.md "Replicas and failover").
SEVERAL_HOSTS_FORM = (
    "postgresql+asyncpg://user:pass@/db?host=HOST1:PORT&host=HOST2:PORT"
    "&target_session_attrs=read-write"
)
SEVERAL_HOSTS_RULE = f"names several hosts in an unsupported form; use {SEVERAL_HOSTS_FORM}"
SEVERAL_HOSTS_PORTS = f"names several hosts, each needs its port: {SEVERAL_HOSTS_FORM}"

# Every placeholder value .env.example ships (tests/ops/test_deployment_files.py checks that
# this set and the file agree). A copied .env.example must not start with a public key.
SHIPPED_PLACEHOLDERS = frozenset(
    {
        "change-me",
        "change-me-too",
        "change-me-three",
        "change-me-to-16-or-more-characters",  # an earlier .env.example's: still refused
        "change-me-to-32-or-more-characters",
        "change-me-to-32-or-more-characters-long",
        "sk-...",
    }
)
GENERATED_SECRET_MIN_LENGTH = 32
GENERATED_SECRET_MIN_DISTINCT = 10
GENERATE_HINT = "generate one with `openssl rand -base64 48`"
PLACEHOLDER_VALUE = f"is the placeholder shipped in .env.example; {GENERATE_HINT}"
WEAK_SECRET = (
    f"is too weak: at least {GENERATED_SECRET_MIN_LENGTH} characters with at least "
    f"{GENERATED_SECRET_MIN_DISTINCT} distinct ones; {GENERATE_HINT}"
)
PLACEHOLDER_PASSWORD = (
    f"has the password placeholder shipped in .env.example; {GENERATE_HINT} for the password"
)


def is_empty(value: object) -> bool:
    """True for a string (or secret) that is empty or only white space."""
    raw = value.get_secret_value() if isinstance(value, SecretStr) else value
    return isinstance(raw, str) and not raw.strip()


def refuse_empty_or_padded(value: object) -> object:
    """``value`` unchanged, or ``ValueError`` when it is a string or secret that is empty or
    has surrounding white space; the message never echoes the value."""
    raw = value.get_secret_value() if isinstance(value, SecretStr) else value
    if isinstance(raw, str):
        if not raw.strip():
            raise ValueError(EMPTY_VALUE)
        if raw != raw.strip():
            raise ValueError(PADDED_VALUE)
    return value


def check_database_url(value: str) -> str:
    """``value`` if it is a ``postgresql+asyncpg://`` URL naming something, with several hosts
    only as ``SEVERAL_HOSTS_FORM`` (each ``HOST:PORT``); ``ValueError`` otherwise."""
    if not value.startswith(DATABASE_URL_SCHEME) or value == DATABASE_URL_SCHEME:
        raise ValueError(DATABASE_URL_RULE)
    try:
        netloc_host = urlsplit(value).netloc.rpartition("@")[2]
        query_hosts = parse_qs(urlsplit(value).query).get("host", [])
    except ValueError:
        return value  # the driver reports a malformed URL when it connects
    if "," in netloc_host or any("," in host for host in query_hosts):
        raise ValueError(SEVERAL_HOSTS_RULE)
    if len(query_hosts) > 1:
        if netloc_host:
            raise ValueError(SEVERAL_HOSTS_RULE)
        if not all(_has_port(host) for host in query_hosts):
            raise ValueError(SEVERAL_HOSTS_PORTS)
    return value


def _has_port(host: str) -> bool:
    name, _, port = host.rpartition(":")
    return bool(name) and port.isdigit()


def database_hosts(url: str) -> list[str]:
    """The host names of a database URL, without ports: the one after ``@`` and every
    ``host=`` of the query (``SEVERAL_HOSTS_FORM``); a Unix socket directory is kept as its
    path; ``""`` for a URL naming none (the driver's default, local)."""
    parts = urlsplit(url)
    hosts = [parts.hostname or ""] if parts.hostname or "host=" not in parts.query else []
    for value in parse_qs(parts.query).get("host", []):
        if value.startswith("/"):
            hosts.append(value)
            continue
        name = value.rpartition(":")[0] if _has_port(value) else value
        hosts.append(name.strip("[]").lower())
    return hosts


def _is_local(host: str) -> bool:
    return host in LOOPBACK_HOSTS or host.startswith("/")


def check_secret_length(value: SecretStr, minimum: int) -> SecretStr:
    """``value`` if it has at least ``minimum`` characters; the message names the rule, not
    the length given (that would reveal part of a secret)."""
    if len(value.get_secret_value()) < minimum:
        raise ValueError(f"must be at least {minimum} characters long")
    return value


def refuse_placeholder(value: SecretStr) -> SecretStr:
    """``value`` unless it is one of ``SHIPPED_PLACEHOLDERS`` (``ValueError``). Provider API
    keys get only this rule: local servers (vLLM, Ollama) take dummy keys such as ``EMPTY``."""
    if value.get_secret_value() in SHIPPED_PLACEHOLDERS:
        raise ValueError(PLACEHOLDER_VALUE)
    return value


def check_generated_secret(value: SecretStr) -> SecretStr:
    """``value`` if it is no placeholder, and long and varied enough to have been generated
    (``WEAK_SECRET``); the message never says how long the value was."""
    refuse_placeholder(value)
    raw = value.get_secret_value()
    if len(raw) < GENERATED_SECRET_MIN_LENGTH or len(set(raw)) < GENERATED_SECRET_MIN_DISTINCT:
        raise ValueError(WEAK_SECRET)
    return value


# Hosts where a database password guards nothing another local user could not reach anyway
# (a development server, a test): only the placeholder rule applies there.
LOOPBACK_HOSTS = frozenset({"", "localhost", "127.0.0.1", "::1"})


def refuse_placeholder_password(url: str) -> str:
    """``url`` unless its password is one of ``SHIPPED_PLACEHOLDERS``, or is weak
    (``WEAK_SECRET``'s rule: compose's database passwords are generated) while any of its
    hosts (``database_hosts``: every one of a multi-host URL) is not on loopback or a Unix
    socket (``ValueError``)."""
    try:
        password = urlsplit(url).password
        hosts = database_hosts(url)
    except ValueError:
        return url
    if password is None:
        return url
    password = unquote(password)
    if password in SHIPPED_PLACEHOLDERS:
        raise ValueError(PLACEHOLDER_PASSWORD)
    weak = (
        len(password) < GENERATED_SECRET_MIN_LENGTH
        or len(set(password)) < GENERATED_SECRET_MIN_DISTINCT
    )
    if weak and not all(_is_local(host) for host in hosts):
        raise ValueError(f"has a weak password: {WEAK_SECRET.removeprefix('is too weak: ')}")
    return url


def describe_errors(error: ValidationError, *, prefix: str) -> list[str]:
    """One line per problem, naming the ``{prefix}{FIELD}`` variable; never the value."""
    lines = []
    for item in error.errors(include_input=False, include_url=False):
        field = ".".join(str(part) for part in item.get("loc", ()))
        name = f"{prefix}{field.upper()}: " if field else ""
        message = item["msg"].removeprefix("Value error, ")
        if item.get("type") == "missing":
            message = "is required and not set"
        lines.append(f"{name}{message}")
    return lines


class LoggingSettingsBase(BaseSettings):
    """How every command of a service logs: ``json`` (one object per line, the default for
    deployments) or ``text`` (one readable line). Built per prefix by ``logging_settings``."""

    model_config = SettingsConfigDict(extra="ignore", frozen=True)

    log_format: Literal["json", "text"] = Field(
        default="json", description="One JSON object per line, or readable text"
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="Lowest level written"
    )


def logging_settings(prefix: str) -> type[LoggingSettingsBase]:
    """The logging settings class reading ``{prefix}LOG_FORMAT`` and ``{prefix}LOG_LEVEL``."""
    return type(
        "LoggingSettings",
        (LoggingSettingsBase,),
        {
            "model_config": SettingsConfigDict(env_prefix=prefix, extra="ignore", frozen=True),
            "__doc__": LoggingSettingsBase.__doc__,
        },
    )


OTLP_ENDPOINT_RULE = "must be an http:// or https:// URL without a query or fragment"


class TracingSettingsBase(BaseSettings):
    """Where every command of a service exports its traces (``pinlog_platform.tracing``);
    unset: no traces, nothing created. Built per prefix by ``tracing_settings``."""

    model_config = SettingsConfigDict(extra="ignore", frozen=True, hide_input_in_errors=True)

    otel_exporter_otlp_endpoint: str | None = Field(
        default=None,
        description="Base URL of an OTLP/HTTP collector (spans go to <URL>/v1/traces); unset: "
        "no traces. Sampling: OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG, default "
        "parentbased_traceidratio 0.1",
    )

    @field_validator("otel_exporter_otlp_endpoint", mode="before")
    @classmethod
    def _endpoint(cls, value: object) -> object:
        value = refuse_empty_or_padded(value)
        if value is None:
            return value
        parts = urlsplit(str(value))
        if (
            parts.scheme not in ("http", "https")
            or not parts.netloc
            or parts.query
            or parts.fragment
        ):
            raise ValueError(OTLP_ENDPOINT_RULE)
        return value


def tracing_settings(prefix: str) -> type[TracingSettingsBase]:
    """The tracing settings class reading ``{prefix}OTEL_EXPORTER_OTLP_ENDPOINT``."""
    return type(
        "TracingSettings",
        (TracingSettingsBase,),
        {
            "model_config": SettingsConfigDict(
                env_prefix=prefix, extra="ignore", frozen=True, hide_input_in_errors=True
            ),
            "__doc__": TracingSettingsBase.__doc__,
        },
    )
