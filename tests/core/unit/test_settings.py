"""Core settings: every problem reported at once, one line each, naming the variable and never
its value; the retry budget is capped by the schema's CHECK."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from core_service.settings import ENV_PREFIX, CoreSettings
from pinlog_platform.settings_rules import describe_errors

VALID = {
    "PINLOG_CORE_DATABASE_URL": "postgresql+asyncpg://u@h/db",
    "PINLOG_CORE_WORKER_BASE_URL": "http://worker:8000/",
    "PINLOG_CORE_INTERNAL_SECRET": "internal-secret-0123456789abcdefgh",
    "PINLOG_CORE_JWT_SECRET": "jwt-secret-0123456789abcdef0123456789",
    "PINLOG_CORE_EMBEDDING_PROFILE": "openai-text-embedding-3-small-1536-cosine-v1",
}


@pytest.fixture
def environment(monkeypatch):
    for name in list(os.environ):
        if name.startswith("PINLOG_CORE_"):
            monkeypatch.delenv(name)
    for name, value in VALID.items():
        monkeypatch.setenv(name, value)
    return monkeypatch


def test_valid_environment_gives_contract_defaults(environment):
    settings = CoreSettings()
    assert settings.worker_base_url == "http://worker:8000"
    assert (settings.pending_expiry_seconds, settings.processing_expiry_seconds) == (300, 600)
    assert (settings.max_retry, settings.batch_size, settings.rescan_period_seconds) == (
        3,
        100,
        300,
    )


def test_every_problem_is_reported_at_once_without_values(environment):
    environment.setenv("PINLOG_CORE_DATABASE_URL", "postgresql://u:hunter2@h/db")
    environment.setenv("PINLOG_CORE_WORKER_BASE_URL", "worker:8000")
    environment.setenv("PINLOG_CORE_INTERNAL_SECRET", "internal-secret-0123456789abcdefgh\n")
    environment.setenv("PINLOG_CORE_MAX_RETRY", "4")
    environment.delenv("PINLOG_CORE_JWT_SECRET")

    with pytest.raises(ValidationError) as caught:
        CoreSettings()

    lines = describe_errors(caught.value, prefix=ENV_PREFIX)
    named = sorted(line.split(":")[0] for line in lines)
    assert named == [
        "PINLOG_CORE_DATABASE_URL",
        "PINLOG_CORE_INTERNAL_SECRET",
        "PINLOG_CORE_JWT_SECRET",
        "PINLOG_CORE_MAX_RETRY",
        "PINLOG_CORE_WORKER_BASE_URL",
    ]
    assert not any("hunter2" in line or "0123456789" in line for line in lines)
    assert any("leading or trailing whitespace" in line for line in lines)


@pytest.mark.parametrize("value", ["16383", "1048577", "-1", "64k"])
def test_the_body_cap_is_bounded(environment, value):
    """At least 16 KiB (every request valid after normalisation fits, even fully escaped), at
    most 1 MiB; the default is 64 KiB."""
    assert CoreSettings().max_request_bytes == 64 * 1024
    environment.setenv("PINLOG_CORE_MAX_REQUEST_BYTES", value)

    with pytest.raises(ValidationError) as caught:
        CoreSettings()

    (line,) = describe_errors(caught.value, prefix=ENV_PREFIX)
    assert line.startswith("PINLOG_CORE_MAX_REQUEST_BYTES: ")
