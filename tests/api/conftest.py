"""API-layer fixtures: a factory for workers with non-default settings (§8)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from tests.harness import RunningWorker, running_worker, worker_settings

CustomWorker = Callable[..., AbstractAsyncContextManager[RunningWorker]]


@pytest.fixture
def custom_worker(engine, migrated_database, fake_openai, presets) -> CustomWorker:
    """``async with custom_worker(**setting_overrides) as worker:`` with presets loaded."""

    def build(**overrides: Any) -> AbstractAsyncContextManager[RunningWorker]:
        return running_worker(worker_settings(migrated_database, fake_openai, **overrides))

    return build
