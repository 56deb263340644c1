"""Fixtures for service tests: usable preset ids (§4, §10)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.worker.harness import PROFILE, RunningWorker
from tests.worker.support import preset_ids

MakeWorker = Callable[..., AbstractAsyncContextManager[RunningWorker]]


@pytest.fixture
async def usable_preset_ids(engine: AsyncEngine, presets) -> set[int]:
    """Active, non-BLOCKED presets of the worker's profile: everything that may be offered."""
    return await preset_ids(
        engine,
        "is_active AND visibility <> 'BLOCKED' AND EXISTS (SELECT 1 FROM "
        "ai.keyword_preset_embedding e WHERE e.preset_id = id AND e.preset_version = version "
        f"AND e.embedding_profile = '{PROFILE}')",
    )
