"""Settings read from the environment (docs/operations.md "Settings").

Every setting set but empty is either its default or refused, as documented per setting; any
value with surrounding whitespace is refused without printing it; every problem is reported
at once, one line each.
"""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from app.settings import ENV_PREFIX, Settings
from pinlog_platform.settings_rules import WEAK_SECRET, describe_errors

VALID = {
    "PINLOG_DATABASE_URL": "postgresql+asyncpg://pinlog:pw-do-not-print@localhost/pinlog",
    "PINLOG_INTERNAL_SECRET": "unit-test-internal-secret-0123456789",
    "PINLOG_EMBEDDING_API_KEY": "sk-embedding-do-not-print",
    "PINLOG_JUDGE_API_KEY": "sk-judge-do-not-print",
}
EMPTY_MEANS_DEFAULT = {
    "embedding_dimension",
    "vector_dimension",
    "embedding_max_input_chars",
    "embedding_batch_size",
    "embedding_batch_wait_ms",
    "judge_similarity_threshold",
    "provider_timeout_seconds",
    "provider_max_retries",
    "breaker_threshold",
    "breaker_cooldown_seconds",
    "processing_expiry_seconds",
    "keyword_top_k",
    "presets_refresh_seconds",
    "keyword_similarity_floor",
    "worker_concurrency",
    "queue_capacity",
    "shutdown_grace_seconds",
    "database_pool_size",
    "max_request_bytes",
    "provider_prices",
    "provider_batch_discount",
    "batch_poll_seconds",
    "usage_flush_seconds",
    "embedding_daily_token_cap",
    "judge_daily_token_cap",
    "embedding_requests_per_minute",
    "embedding_tokens_per_minute",
    "judge_requests_per_minute",
    "judge_tokens_per_minute",
    "worker_replicas",
    "rate_budget_window_seconds",
    "judge_votes",
    "judge_fallbacks",
    "search_similarity_floor",
    "search_similarity_floor_word",
    "search_top_ratio",
    "search_keyword_match_threshold",
    "search_keyword_match_top",
    "request_timeout_seconds",
    "limit_concurrency",
    "max_header_bytes",
    "head_timeout",
    "timeout_keep_alive",
}
EMPTY_MEANS_UNSET = {
    "embedding_api_key",
    "judge_api_key",
    "judge_fallback_1_api_key",
    "judge_fallback_2_api_key",
    "judge_fallback_3_api_key",
}
EMPTY_IS_REFUSED = set(Settings.model_fields) - EMPTY_MEANS_DEFAULT - EMPTY_MEANS_UNSET


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch):
    """Only what each test sets: the machine's own PINLOG_* variables are removed."""
    for name in list(os.environ):
        if name.upper().startswith("PINLOG_"):
            monkeypatch.delenv(name)

    def apply(values: dict[str, str]) -> None:
        for name, value in values.items():
            monkeypatch.setenv(name, value)

    return apply


def problems() -> list[str]:
    with pytest.raises(ValidationError) as raised:
        Settings()
    return describe_errors(raised.value, prefix=ENV_PREFIX)


def test_the_three_groups_cover_every_setting():
    assert {
        "database_url",
        "search_database_url",
        "internal_secret",
        "offline",
        "refuse_while_provider_unavailable",
        "otel_traceparent_to_providers",
        "database_transaction_pooling",
        "embedding_provider",
        "embedding_base_url",
        "embedding_model",
        "embedding_distance",
        "embedding_encoding",
        "embedding_batch_api",
        "embedding_profile",
        "judge_provider",
        "judge_base_url",
        "judge_model",
        "judge_batch_api",
    } == EMPTY_IS_REFUSED


@pytest.mark.parametrize("field", sorted(EMPTY_MEANS_DEFAULT))
def test_an_empty_number_means_its_default(env, field):
    env({**VALID, f"PINLOG_{field.upper()}": ""})

    assert getattr(Settings(), field) == Settings.model_fields[field].default


@pytest.mark.parametrize("field", sorted(EMPTY_IS_REFUSED))
@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_url_secret_name_or_choice_is_refused(env, field, value):
    """``PINLOG_EMBEDDING_BASE_URL=`` must never become api.openai.com silently."""
    env({**VALID, f"PINLOG_{field.upper()}": value})

    assert problems() == [f"PINLOG_{field.upper()}: is set but empty; give a value or unset it"]


@pytest.mark.parametrize("field", ["embedding_api_key", "judge_api_key"])
def test_an_empty_api_key_is_not_set_and_therefore_required_for_openai(env, field):
    env({**VALID, f"PINLOG_{field.upper()}": ""})

    (line,) = problems()
    assert line.startswith(f"PINLOG_{field.upper()}: is required when")


@pytest.mark.parametrize(
    "field", sorted(EMPTY_MEANS_UNSET - {"embedding_api_key", "judge_api_key"})
)
def test_an_empty_fallback_key_is_not_set(env, field):
    env({**VALID, f"PINLOG_{field.upper()}": ""})

    assert getattr(Settings(), field) is None


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("PINLOG_INTERNAL_SECRET", "unit-test-internal-secret-0123456789\n"),  # from a file
        ("PINLOG_EMBEDDING_API_KEY", " sk-embedding-do-not-print"),
        ("PINLOG_JUDGE_API_KEY", "sk-judge-do-not-print\r\n"),
        ("PINLOG_DATABASE_URL", VALID["PINLOG_DATABASE_URL"] + "\n"),
        ("PINLOG_JUDGE_BASE_URL", "https://gateway.internal/v1 "),
    ],
)
def test_surrounding_whitespace_is_refused_with_a_clear_message_and_never_the_value(
    env, variable, value
):
    env({**VALID, variable: value})

    lines = problems()

    assert lines == [
        f"{variable}: has leading or trailing whitespace (a newline from a file?); remove it"
    ]
    for secret in VALID.values():
        assert not any(secret.split("@")[0] in line for line in lines)


def test_every_problem_is_reported_at_once_one_line_each(env):
    """A new user learns all required settings in one try, and what else is wrong."""
    env(
        {
            "PINLOG_EMBEDDING_BASE_URL": "",
            "PINLOG_WORKER_CONCURRENCY": "many",
            "PINLOG_EMBEDDING_DIMENSION": "768",
        }
    )

    assert problems() == [
        "PINLOG_DATABASE_URL: is required and not set",
        "PINLOG_INTERNAL_SECRET: is required and not set",
        "PINLOG_EMBEDDING_BASE_URL: is set but empty; give a value or unset it",
        "PINLOG_EMBEDDING_API_KEY: is required when PINLOG_EMBEDDING_PROVIDER is openai",
        "PINLOG_EMBEDDING_PROFILE: 'openai-text-embedding-3-small-1536-cosine-v1' says "
        "dimension 1536, PINLOG_EMBEDDING_DIMENSION is 768",
        "PINLOG_JUDGE_API_KEY: is required when PINLOG_JUDGE_PROVIDER is openai",
        "PINLOG_WORKER_CONCURRENCY: Input should be a valid integer, unable to parse string "
        "as an integer",
    ]


def test_a_short_secret_names_characters_not_items(env):
    env({**VALID, "PINLOG_INTERNAL_SECRET": "short-secret"})

    assert problems() == [f"PINLOG_INTERNAL_SECRET: {WEAK_SECRET}"]


def test_a_base_url_that_is_not_http_is_refused(env):
    env({**VALID, "PINLOG_EMBEDDING_BASE_URL": "api.openai.com/v1"})

    assert problems() == ["PINLOG_EMBEDDING_BASE_URL: must be an http:// or https:// URL"]


def test_the_pool_is_sized_from_the_worker_concurrency_unless_set(env):
    env({**VALID, "PINLOG_WORKER_CONCURRENCY": "8"})
    assert Settings().pool_size == 10  # 8 worker tasks + 2 for search

    env({"PINLOG_DATABASE_POOL_SIZE": "3"})
    assert Settings().pool_size == 3
