"""Settings validation at startup (CONTRACT §5, §8; STYLE practice 9)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from pydantic import ValidationError

from app.settings import ENV_PREFIX, OFFLINE_EMBEDDING_MODEL, OFFLINE_PROFILE, Settings
from pinlog_platform.settings_rules import describe_errors

DATABASE_URL = "postgresql+asyncpg://pinlog:pinlog@localhost:5432/pinlog"
SECRET = "unit-test-internal-secret-0123456789"


@pytest.fixture(autouse=True)
def _no_pinlog_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the explicit keyword arguments of each test may configure Settings."""
    for name in list(os.environ):
        if name.upper().startswith("PINLOG_"):
            monkeypatch.delenv(name)


def openai_settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": DATABASE_URL,
        "internal_secret": SECRET,
        "embedding_provider": "openai",
        "embedding_api_key": "sk-embedding",
        "judge_provider": "openai",
        "judge_api_key": "sk-judge",
    }
    values.update(overrides)
    return Settings(**values)


def test_production_defaults_with_both_keys_are_valid():
    settings = openai_settings()

    assert settings.embedding_profile == "openai-text-embedding-3-small-1536-cosine-v1"
    assert settings.embedding_dimension == 1536


def test_profile_naming_another_model_is_rejected_naming_both_values():
    with pytest.raises(ValidationError) as caught:
        openai_settings(embedding_model="text-embedding-3-large")

    message = str(caught.value)
    assert "openai-text-embedding-3-small-1536-cosine-v1" in message
    assert "text-embedding-3-large" in message


def test_profile_naming_another_dimension_is_rejected_naming_both_values():
    with pytest.raises(ValidationError) as caught:
        openai_settings(embedding_dimension=768)

    message = str(caught.value)
    assert "says dimension 1536" in message
    assert "PINLOG_EMBEDDING_DIMENSION is 768" in message


def test_profile_naming_another_distance_is_rejected_naming_both_values():
    with pytest.raises(ValidationError) as caught:
        openai_settings(embedding_profile="openai-text-embedding-3-small-1536-l2-v1")

    message = str(caught.value)
    assert "'l2'" in message
    assert "'cosine'" in message


def test_profile_without_dimension_distance_and_revision_is_rejected():
    with pytest.raises(ValidationError, match="must look like"):
        openai_settings(embedding_profile="text-embedding-3-small")


def problems(**overrides: Any) -> list[str]:
    with pytest.raises(ValidationError) as raised:
        openai_settings(**overrides)
    return describe_errors(raised.value, prefix=ENV_PREFIX)


def test_openai_embedding_provider_without_api_key_is_rejected():
    assert problems(embedding_api_key=None) == [
        "PINLOG_EMBEDDING_API_KEY: is required when PINLOG_EMBEDDING_PROVIDER is openai"
    ]


def test_openai_embedding_provider_with_blank_api_key_is_rejected():
    """An empty or blank API key means "not set" (docs/operations.md), so it is required."""
    assert problems(embedding_api_key="   ") == [
        "PINLOG_EMBEDDING_API_KEY: is required when PINLOG_EMBEDDING_PROVIDER is openai"
    ]


def test_openai_judge_without_api_key_is_rejected():
    assert problems(judge_api_key=None) == [
        "PINLOG_JUDGE_API_KEY: is required when PINLOG_JUDGE_PROVIDER is openai"
    ]


def test_offline_providers_need_no_api_keys():
    settings = Settings(
        database_url=DATABASE_URL,
        internal_secret=SECRET,
        embedding_provider="hashing",
        embedding_model=OFFLINE_EMBEDDING_MODEL,
        embedding_profile=OFFLINE_PROFILE,
        judge_provider="similarity",
    )

    assert settings.embedding_api_key is None
    assert settings.judge_api_key is None


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://pinlog@localhost/pinlog",
        "postgresql+psycopg://pinlog@localhost/pinlog",
        "sqlite+aiosqlite:///pinlog.db",
    ],
)
def test_database_url_other_than_asyncpg_is_rejected(url):
    with pytest.raises(ValidationError, match=r"postgresql\+asyncpg://"):
        openai_settings(database_url=url)


def test_internal_secret_shorter_than_16_characters_is_rejected():
    with pytest.raises(ValidationError, match="internal_secret"):
        openai_settings(internal_secret="too-short-15chr")


def test_internal_secret_is_required():
    with pytest.raises(ValidationError, match="internal_secret"):
        Settings(database_url=DATABASE_URL, embedding_api_key="k", judge_api_key="k")


def test_hashing_provider_with_the_production_model_and_profile_is_rejected():
    with pytest.raises(ValidationError, match="hashing needs PINLOG_EMBEDDING_MODEL"):
        openai_settings(embedding_provider="hashing")


@pytest.mark.parametrize(
    "overrides",
    [
        {"internal_secret": "short-SECRET"},
        {"judge_api_key": None},
        {"embedding_dimension": 1024},
    ],
    ids=["short-secret", "missing-judge-key", "contradiction"],
)
def test_validation_errors_never_print_secret_values(overrides):
    secrets = ("short-SECRET", "sk-embedding", "sk-judge", SECRET)

    with pytest.raises(ValidationError) as raised:
        openai_settings(**overrides)

    lines = describe_errors(raised.value, prefix=ENV_PREFIX)
    assert lines
    for rendered in (str(raised.value), *lines):
        assert not any(secret in rendered for secret in secrets), rendered


def test_described_errors_name_the_environment_variable():
    with pytest.raises(ValidationError) as raised:
        Settings(database_url=DATABASE_URL)

    assert describe_errors(raised.value, prefix=ENV_PREFIX) == [
        "PINLOG_INTERNAL_SECRET: is required and not set",
        "PINLOG_EMBEDDING_API_KEY: is required when PINLOG_EMBEDDING_PROVIDER is openai",
        "PINLOG_JUDGE_API_KEY: is required when PINLOG_JUDGE_PROVIDER is openai",
    ]
