"""A running worker for service, API and end-to-end tests: the real app on real uvicorn.

The app is built by ``create_app`` exactly as in production, with the OpenAI-compatible
providers pointed at the fake OpenAI server (a real HTTP server) and presets loaded from the
bundled list through the same provider.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.ext.asyncio import AsyncEngine

from app.main import create_app
from app.providers.openai_compatible import OpenAIEmbedder
from app.repository import keyword_preset
from app.repository.keyword_preset import PresetRow
from app.service.preset_loader import load_presets, read_preset_file
from app.service.processing import ContextProcessor
from app.service.requests import ProcessRequest
from app.settings import Settings
from tests.fake_openai import FakeOpenAI

SECRET = "test-internal-secret-0123456789abcdef"
PROFILE = "openai-text-embedding-3-small-1536-cosine-v1"
PROCESS_PATH = "/internal/v1/context/process"


def worker_settings(database_url: str, fake: FakeOpenAI, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "database_url": database_url,
        "internal_secret": SECRET,
        "embedding_provider": "openai",
        "embedding_base_url": fake.base_url,
        "embedding_api_key": "sk-test-embedding-key",
        "judge_provider": "openai",
        "judge_base_url": fake.base_url,
        "judge_api_key": "sk-test-judge-key",
        "judge_model": "fake-chat",
        "provider_max_retries": 0,
        "provider_timeout_seconds": 20,
        "keyword_similarity_floor": 0.05,
        "breaker_threshold": 1000,
        "worker_concurrency": 4,
        "shutdown_grace_seconds": 2,
        # One provider request per embedding stage, as most tests count them; the batching
        # has its own tests (tests/worker/service/test_hot_path_budget.py) and the e2e processes
        # run with it.
        "embedding_batch_size": 1,
    }
    values.update(overrides)
    return Settings(**values)


async def embed_bundled_presets(
    engine: AsyncEngine, settings: Settings, fake: FakeOpenAI
) -> list[PresetRow]:
    """Load the bundled presets through the real loader and the fake server; return the
    stored rows so later tests can restore them without embedding again."""
    embedder = OpenAIEmbedder.from_settings(settings)
    try:
        await load_presets(engine, embedder, read_preset_file(), settings.embedding_profile)
    finally:
        await embedder.aclose()
    fake.reset()
    async with engine.connect() as conn:
        return await keyword_preset.load_profile(conn, settings.embedding_profile)


@dataclass
class RunningWorker:
    app: FastAPI
    settings: Settings
    client: httpx.AsyncClient

    @property
    def processor(self) -> ContextProcessor:
        return self.app.state.processor

    async def process(self, context_id: int, text: str, *, user_id: int = 1, record_id: int = 1):
        """Run the pipeline for one request directly (no queue), as a worker task would."""
        await self.processor.process(ProcessRequest(context_id, user_id, record_id, text))

    async def post(self, body: dict[str, Any], *, secret: str | None = SECRET) -> httpx.Response:
        headers = {} if secret is None else {"X-Internal-Secret": secret}
        return await self.client.post(PROCESS_PATH, json=body, headers=headers)

    async def metric(self, name: str, **labels: str) -> float | None:
        """The sample ``name`` with exactly ``labels`` from this worker's ``GET /metrics``;
        ``None`` when the series does not exist."""
        response = await self.client.get("/metrics")
        assert response.status_code == 200
        return sample_value(response.text, name, **labels)

    async def drain(self) -> None:
        """Wait until every queued request has been handled."""
        await asyncio.wait_for(self.app.state.pool.join(), timeout=60)


def sample_value(exposition: str, name: str, **labels: str) -> float | None:
    """The sample ``name`` with exactly ``labels`` in a Prometheus text ``exposition``."""
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


@asynccontextmanager
async def serving(app: FastAPI, **options: Any) -> AsyncIterator[str]:
    """Serve ``app`` with real uvicorn on a free loopback port; yields its base URL.
    ``options``: more ``uvicorn.Config`` arguments (the services' limits)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            app, log_config=None, access_log=False, timeout_graceful_shutdown=5, **options
        )
    )
    serving_task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if serving_task.done():
                await serving_task
                raise RuntimeError("server did not start")
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await serving_task
        sock.close()


@asynccontextmanager
async def running_worker(settings: Settings) -> AsyncIterator[RunningWorker]:
    app = create_app(settings)
    async with serving(app) as base_url, httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        yield RunningWorker(app, settings, client)
