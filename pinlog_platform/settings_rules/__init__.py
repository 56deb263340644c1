"""Rules both services' settings follow, with one message each (settings errors name the
variable and never print a value).

- ``refuse_empty_or_padded``: a set value that is empty, or has surrounding white space (a
  secret read from a file with its newline), is refused;
- ``check_database_url``: a ``postgresql+asyncpg://`` URL with something after the scheme;
- ``check_secret_length``: a secret at least ``minimum`` characters long;
- ``describe_errors``: one line per problem, naming the ``{prefix}*`` variable;
- ``logging_settings``: the log format and level settings class for a prefix.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

DATABASE_URL_SCHEME = "postgresql+asyncpg://"
EMPTY_VALUE = "is set but empty; give a value or unset it"
PADDED_VALUE = "has leading or trailing whitespace (a newline from a file?); remove it"
DATABASE_URL_RULE = "must be a postgresql+asyncpg:// URL"


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
    """``value`` if it is a ``postgresql+asyncpg://`` URL naming something; ``ValueError``."""
    if not value.startswith(DATABASE_URL_SCHEME) or value == DATABASE_URL_SCHEME:
        raise ValueError(DATABASE_URL_RULE)
    return value


def check_secret_length(value: SecretStr, minimum: int) -> SecretStr:
    """``value`` if it has at least ``minimum`` characters; the message names the rule, not
    the length given (that would reveal part of a secret)."""
    if len(value.get_secret_value()) < minimum:
        raise ValueError(f"must be at least {minimum} characters long")
    return value


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
