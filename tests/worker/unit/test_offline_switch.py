"""``PINLOG_OFFLINE`` and the offline encoder's settings (CONTRACT §5)."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from app.settings import OFFLINE_DEFAULTS, USE_PROFILE, Settings

DATABASE_URL = "postgresql+asyncpg://pinlog:pinlog@localhost:5432/pinlog"
SECRET = "unit-test-internal-secret-0123456789"


@pytest.fixture(autouse=True)
def _only_given_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("PINLOG_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PINLOG_DATABASE_URL", DATABASE_URL)
    monkeypatch.setenv("PINLOG_INTERNAL_SECRET", SECRET)


def test_offline_switch_selects_encoder_learned_judge_thresholds_and_profile(monkeypatch):
    monkeypatch.setenv("PINLOG_OFFLINE", "true")

    settings = Settings()

    assert settings.offline is True
    for name, value in OFFLINE_DEFAULTS.items():
        assert getattr(settings, name) == value, name
    assert settings.embedding_profile == USE_PROFILE == "local-use-multilingual-v3-512-cosine-v1"
    assert settings.embedding_dimension == 512
    assert settings.vector_dimension == 1536  # stored zero-padded in VECTOR(1536)
    assert settings.embedding_api_key is None  # no key needed offline


def test_explicitly_set_variables_win_over_the_offline_switch(monkeypatch):
    monkeypatch.setenv("PINLOG_OFFLINE", "1")
    monkeypatch.setenv("PINLOG_KEYWORD_TOP_K", "7")
    monkeypatch.setenv("PINLOG_JUDGE_PROVIDER", "similarity")

    settings = Settings()

    assert settings.keyword_top_k == 7
    assert settings.judge_provider == "similarity"
    assert settings.embedding_provider == "use-multilingual"


def test_without_the_switch_production_defaults_stay(monkeypatch):
    monkeypatch.setenv("PINLOG_EMBEDDING_API_KEY", "sk-e")
    monkeypatch.setenv("PINLOG_JUDGE_API_KEY", "sk-j")

    settings = Settings()

    assert settings.offline is False
    assert (settings.embedding_provider, settings.judge_provider) == ("openai", "openai")


def test_an_invalid_switch_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("PINLOG_OFFLINE", "perhaps")

    with pytest.raises(ValidationError, match="offline"):
        Settings()


def test_encoder_with_another_dimension_is_rejected():
    with pytest.raises(ValidationError, match="must be 512 for PINLOG_EMBEDDING_PROVIDER"):
        Settings(
            offline=True,
            embedding_dimension=768,
            embedding_profile="local-use-multilingual-v3-768-cosine-v1",
        )


def test_model_dimension_above_the_column_dimension_is_rejected():
    with pytest.raises(ValidationError, match="is 256, smaller than PINLOG_EMBEDDING_DIM"):
        Settings(offline=True, vector_dimension=256)


def test_learned_judge_needs_the_encoder_it_was_trained_on():
    with pytest.raises(ValidationError, match="learned needs"):
        Settings(
            judge_provider="learned",
            embedding_provider="hashing",
            embedding_model="hashing-char-ngram",
            embedding_profile="local-hashing-char-ngram-1536-cosine-v1",
        )


def test_learned_judge_profile_names_revision_and_fallback_threshold():
    settings = Settings(offline=True, judge_similarity_threshold=0.3)

    assert settings.judge_profile == "local-use-logreg-judge-r4-fallback-0.3-v1"
