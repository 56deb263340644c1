"""Operator endpoints and startup checks (CONTRACT §4, §8)."""

from __future__ import annotations

import pytest

from app.errors import ConfigurationError
from app.main import create_app
from tests.worker.harness import worker_settings


async def test_healthz_answers_200(worker):
    response = await worker.client.get("/healthz")

    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


AVAILABLE = {"available": True, "retryAfterSeconds": None, "reason": None}


async def test_readyz_answers_200_when_database_and_presets_are_ready(worker):
    """The pinned body: exactly these keys, both providers available."""
    response = await worker.client.get("/readyz")

    assert response.status_code == 200
    assert response.json() == {
        "status": "ready",
        "mode": "online",
        "profile": "openai-text-embedding-3-small-1536-cosine-v1",
        "presetVersion": 1,
        "maxRequestBytes": 65536,
        "batch": False,
        "keywordBatch": False,
        "providers": {"embedding": AVAILABLE, "judge": AVAILABLE},
    }


async def test_startup_fails_with_configuration_error_when_no_presets_are_stored(
    engine, migrated_database, fake_openai
):
    """§4: zero usable presets for the profile stops startup.

    The lifespan is entered directly: under uvicorn the same error ends in ``SystemExit(3)``
    raised from the server task, which would escape into the test's event loop.
    """
    app = create_app(worker_settings(migrated_database, fake_openai))

    with pytest.raises(ConfigurationError, match="no usable keyword presets"):
        async with app.router.lifespan_context(app):
            pass
