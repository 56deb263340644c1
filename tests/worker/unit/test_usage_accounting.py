"""``usage`` parsing and the price table setting."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from app.providers.usage import chat_usage, embedding_usage, estimate_tokens
from app.settings import Settings
from app.settings.costs import DEFAULT_PRICES, ModelPrice

REQUIRED = {
    "PINLOG_DATABASE_URL": "postgresql+asyncpg://u:p@localhost/db",
    "PINLOG_INTERNAL_SECRET": "usage-test-internal-secret-0123456789",
    "PINLOG_OFFLINE": "true",
}


def test_embedding_usage_is_read_or_estimated_as_utf8_bytes_over_three() -> None:
    read = embedding_usage("m", {"model": "m-1", "usage": {"prompt_tokens": 7}}, ["abc"])
    assert (read.embedding_tokens, read.estimated, read.answered_model) == (7, False, "m-1")
    only_total = embedding_usage("m", {"usage": {"total_tokens": 5}}, ["abc"])
    assert (only_total.embedding_tokens, only_total.estimated) == (5, False)
    # "카페" is 6 UTF-8 bytes, "ab" 2: 8 / 3 rounded up.
    absent = embedding_usage("m", {"data": []}, ["카페", "ab"])
    assert (absent.embedding_tokens, absent.estimated, absent.answered_model) == (3, True, None)
    for broken in ({"usage": None}, {"usage": {"prompt_tokens": -1}}, {"usage": {"x": True}}):
        assert embedding_usage("m", broken, ["abcdef"]).estimated


def test_chat_usage_is_read_or_estimated_per_missing_part() -> None:
    body = {"choices": [{"message": {"content": "x" * 9}}]}
    read = chat_usage("m", {**body, "usage": {"prompt_tokens": 4, "completion_tokens": 2}}, ["p"])
    assert (read.prompt_tokens, read.completion_tokens, read.estimated) == (4, 2, False)
    half = chat_usage("m", {**body, "usage": {"prompt_tokens": 4}}, ["p"])
    assert (half.prompt_tokens, half.completion_tokens, half.estimated) == (4, 3, True)
    absent = chat_usage("m", body, ["a" * 10, "b" * 2])
    assert (absent.prompt_tokens, absent.completion_tokens, absent.total) == (4, 3, 7)
    assert estimate_tokens("") == 0


def test_cached_tokens_are_read_from_prompt_tokens_details_as_a_part_of_the_prompt() -> None:
    body = {"choices": [{"message": {"content": "x"}}]}
    usage = {"prompt_tokens": 2000, "completion_tokens": 5}
    cached = chat_usage(
        "m", {**body, "usage": {**usage, "prompt_tokens_details": {"cached_tokens": 1152}}}, []
    )
    assert (cached.prompt_tokens, cached.cached_prompt_tokens, cached.total) == (2000, 1152, 2005)
    # Absent, null or malformed details: nothing cached; a figure beyond the prompt is capped.
    for details in (None, {}, {"cached_tokens": None}, {"cached_tokens": -3}, "x"):
        answer = {**body, "usage": {**usage, "prompt_tokens_details": details}}
        assert chat_usage("m", answer, []).cached_prompt_tokens == 0
    over = {**body, "usage": {**usage, "prompt_tokens_details": {"cached_tokens": 9999}}}
    assert chat_usage("m", over, []).cached_prompt_tokens == 2000
    embedded = embedding_usage(
        "m", {"usage": {"prompt_tokens": 30, "prompt_tokens_details": {"cached_tokens": 8}}}, []
    )
    assert (embedded.embedding_tokens, embedded.cached_prompt_tokens) == (30, 8)
    # An estimate has no cache figure.
    assert chat_usage("m", body, ["p" * 30]).cached_prompt_tokens == 0


def test_the_cached_prompt_price_defaults_to_half_for_gpt_4o_mini_and_full_elsewhere() -> None:
    mini = DEFAULT_PRICES["gpt-4o-mini"]
    assert mini.cached_prompt_price == mini.prompt * 0.5 == 0.075
    assert ModelPrice(prompt=1.0).cached_prompt_price == 1.0
    assert ModelPrice(embedding=0.02).cached_prompt_price == 0.02
    assert ModelPrice(prompt=1.0, cached_prompt=0.1).cached_prompt_price == 0.1


def test_provider_prices_come_from_json_and_add_to_the_defaults(monkeypatch) -> None:
    for name, value in REQUIRED.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(
        "PINLOG_PROVIDER_PRICES",
        '{"my-model": {"prompt": 1.5, "completion": 3}, "gpt-4o-mini": {"prompt": 0.1}}',
    )
    prices = Settings().prices

    assert prices["my-model"] == ModelPrice(prompt=1.5, completion=3.0)
    assert prices["gpt-4o-mini"] == ModelPrice(prompt=0.1)
    assert prices["text-embedding-3-small"] == DEFAULT_PRICES["text-embedding-3-small"]


def test_the_batch_discount_is_a_factor_of_at_most_one(monkeypatch) -> None:
    for name, value in REQUIRED.items():
        monkeypatch.setenv(name, value)
    assert Settings().provider_batch_discount == 0.5
    monkeypatch.setenv("PINLOG_PROVIDER_BATCH_DISCOUNT", "0.4")
    assert Settings().provider_batch_discount == 0.4
    for bad in ("0", "1.5", "-0.5"):
        monkeypatch.setenv("PINLOG_PROVIDER_BATCH_DISCOUNT", bad)
        with pytest.raises(ValidationError, match="provider_batch_discount"):
            Settings()


@pytest.mark.parametrize(
    "value", ['{"m": {"prompt": -1}}', '{"m": {"input": 1}}', '["m"]', "not json"]
)
def test_a_bad_price_table_is_a_settings_error(monkeypatch, value: str) -> None:
    for name, setting in REQUIRED.items():
        monkeypatch.setenv(name, setting)
    monkeypatch.setenv("PINLOG_PROVIDER_PRICES", value)
    with pytest.raises(ValidationError, match="provider_prices"):
        Settings()
