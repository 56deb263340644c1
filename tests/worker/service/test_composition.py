"""``build_worker`` builds the whole worker with no HTTP app around it and closes it on exit
(the composition root knows nothing of FastAPI)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from app.composition import build_worker
from app.metrics import WorkerMetrics
from app.service.requests import ProcessRequest
from tests.worker.harness import worker_settings
from tests.worker.support import fetch_state, make_state


async def test_a_worker_built_without_http_processes_a_context_and_stops_on_exit(
    engine, migrated_database, fake_openai, presets
):
    await make_state(engine, context_id=1)

    async with build_worker(
        worker_settings(migrated_database, fake_openai), WorkerMetrics()
    ) as worker:
        assert worker.pool.submit(ProcessRequest(1, 1, 1, "조용한 카페에서 책을 읽었다"))
        await asyncio.wait_for(worker.pool.join(), timeout=60)
        with pytest.raises(dataclasses.FrozenInstanceError):
            worker.pool = worker.pool  # type: ignore[misc]

    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert fake_openai.embedding_calls == 1
    # The worker pool was stopped on the way out: it accepts nothing more.
    assert not worker.pool.submit(ProcessRequest(2, 1, 1, "늦은 저녁"))
