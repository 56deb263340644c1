"""Fixtures for service tests: custom workers, held provider calls, usable preset ids (§3, §10).

Race tests hold a provider call in flight with ``Scripted(block=...)`` and learn that it
arrived from ``Scripted.entered``; no test sleeps to order events.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.fake_openai import Scripted
from tests.harness import PROFILE, RunningWorker, running_worker, worker_settings
from tests.service.support import preset_ids

MakeWorker = Callable[..., AbstractAsyncContextManager[RunningWorker]]


@pytest.fixture
def make_worker(migrated_database: str, fake_openai, presets) -> MakeWorker:
    """``async with make_worker(**overrides) as w``: a worker with overridden settings."""

    def factory(**overrides: Any) -> AbstractAsyncContextManager[RunningWorker]:
        return running_worker(worker_settings(migrated_database, fake_openai, **overrides))

    return factory


@pytest.fixture
def hold() -> Iterator[Callable[[], Scripted]]:
    """``hold()`` makes a ``Scripted`` answer that waits until ``.block.set()``.

    Every hold is released at teardown, so a failing test never leaves a call hanging.
    """
    made: list[Scripted] = []

    def factory() -> Scripted:
        scripted = Scripted(block=threading.Event())
        made.append(scripted)
        return scripted

    yield factory
    for scripted in made:
        assert scripted.block is not None
        scripted.block.set()


@pytest.fixture
async def usable_preset_ids(engine: AsyncEngine, presets) -> set[int]:
    """Active, non-BLOCKED presets of the worker's profile: everything that may be offered."""
    return await preset_ids(
        engine, f"is_active AND visibility <> 'BLOCKED' AND embedding_profile = '{PROFILE}'"
    )
