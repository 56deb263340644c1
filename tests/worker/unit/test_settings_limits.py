"""Settings that cannot work must stop startup (CONTRACT §1, §2, §6; STYLE practice 9)."""

from __future__ import annotations

import pydantic
import pytest

from app.settings import Settings

BASE = {
    "database_url": "postgresql+asyncpg://worker@localhost/pinlog",
    "internal_secret": "limits-test-internal-secret-0123456789",
    "embedding_api_key": "sk-test",
    "judge_api_key": "sk-test",
}


def test_judge_profile_longer_than_the_model_profile_column_is_refused():
    """§1: ``judge_profile`` (``openai-chat-<model>-p<n>``) must fit ``model_profile``
    VARCHAR(100), so a judge model name that overflows it fails startup."""
    with pytest.raises(pydantic.ValidationError):
        Settings(**BASE, judge_model="m" * 95)


def test_one_provider_call_cannot_outlive_the_processing_expiry():
    """§2, §6, §10 #9: one provider call with its bounded retries (timeout x attempts) must
    not outlast the PROCESSING expiry, or a rescan would reclaim a live stage and pay twice."""
    with pytest.raises(pydantic.ValidationError):
        Settings(
            **BASE,
            provider_timeout_seconds=400,
            provider_max_retries=2,
            processing_expiry_seconds=600,
        )
