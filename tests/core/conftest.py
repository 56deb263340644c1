"""Fixtures of the core-service tests: members, a fake or real worker, a running core."""

from __future__ import annotations

from typing import Any

import pytest

from tests.core.harness import core_settings, make_member, running_core
from tests.fake_worker import FakeWorker
from tests.worker.harness import SECRET, serving


@pytest.fixture
async def members(engine):
    """Members 1, 2 and 3 exist and are active."""
    for member_id in (1, 2, 3):
        await make_member(engine, member_id)
    return (1, 2, 3)


@pytest.fixture
async def fake_worker():
    """A ``FakeWorker`` served on loopback; yields it with ``.base_url`` set."""
    worker = FakeWorker(SECRET)
    async with serving(worker.app) as base_url:
        worker.base_url = base_url
        yield worker
        worker.release.set()


@pytest.fixture
def make_core(migrated_database, members):
    """``async with make_core(worker_base_url, **overrides) as core``."""

    def factory(worker_base_url: str, **overrides: Any):
        return running_core(core_settings(migrated_database, worker_base_url, **overrides))

    return factory


@pytest.fixture
async def core_with_fake_worker(make_core, fake_worker):
    async with make_core(fake_worker.base_url) as core:
        yield core


@pytest.fixture
async def core(make_core, worker):
    """The core service wired to a real running worker (fake OpenAI provider)."""
    async with make_core(str(worker.client.base_url)) as running:
        yield running
