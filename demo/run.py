"""``pinlog-ai demo`` (the README's ``make run``): the whole path, offline, on real parts.

Embedded PostgreSQL (unless ``PINLOG_DATABASE_URL`` is set) -> migrations -> presets embedded
with the offline encoder -> the worker served over HTTP -> every bundled sample note
created as the core side does (``PENDING`` state committed, then the POST) -> a table of the
results -> keep serving until interrupted.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn
import yaml

import pinlog_schema
from app import embedded_postgres
from app.main import create_app
from app.providers.factory import build_embedding_provider
from app.repository.db import create_engine
from app.service.preset_loader import load_presets, read_preset_file
from app.settings import DatabaseSettings, Settings
from demo import core_side, table

SAMPLES = Path(__file__).with_name("sample_contexts.yaml")
PROCESS_PATH = "/internal/v1/context/process"


@dataclass(frozen=True, slots=True)
class Sample:
    user_id: int
    record_id: int
    place: str
    text: str


def load_samples(path: Path = SAMPLES) -> list[Sample]:
    entries = yaml.safe_load(path.read_text(encoding="utf-8"))["contexts"]
    return [Sample(e["user_id"], e["record_id"], e["place"], e["text"]) for e in entries]


def offline_settings(
    database_url: str, internal_secret: str | None = None, **overrides: object
) -> Settings:
    """Development settings: the ``PINLOG_OFFLINE`` switch (local encoder and learned judge,
    no network, no keys; ``app.settings.OFFLINE_DEFAULTS``); explicit settings still win."""
    values: dict[str, object] = {
        "database_url": database_url,
        "internal_secret": internal_secret or secrets.token_urlsafe(24),
        "offline": True,
    }
    values.update(overrides)
    return Settings(**values)


def free_port(preferred: int) -> int:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", preferred))
        except OSError:
            probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def prepare_database(settings: Settings) -> None:
    """Apply migrations and load presets with the settings' embedding profile."""
    engine = create_engine(settings.database_url, with_vector_codec=False)
    try:
        await pinlog_schema.upgrade(engine)
    finally:
        await engine.dispose()
    engine = create_engine(settings.database_url)
    embedder = build_embedding_provider(settings)
    try:
        await load_presets(engine, embedder, read_preset_file(), settings.embedding_profile)
    finally:
        await embedder.aclose()
        await engine.dispose()


async def feed_and_report(
    settings: Settings, base_url: str, samples: list[Sample], *, wait_seconds: float = 300
) -> list[core_side.ContextResult]:
    """Create each sample as the core side would, POST it, wait, and read the results."""
    engine = create_engine(settings.database_url, pool_size=2)
    headers = {"X-Internal-Secret": settings.internal_secret.get_secret_value()}
    try:
        first_id = await core_side.next_context_id(engine)
        ids = [first_id + offset for offset in range(len(samples))]
        async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=10) as client:
            for context_id, sample in zip(ids, samples, strict=True):
                await core_side.create_pending_state(engine, context_id)
                body = {
                    "contextId": context_id,
                    "userId": sample.user_id,
                    "recordId": sample.record_id,
                    "text": sample.text,
                    "placeMeta": {"name": sample.place},
                }
                response = await client.post(PROCESS_PATH, json=body)
                while response.status_code == 503:  # queue full: honour Retry-After
                    await asyncio.sleep(float(response.headers.get("Retry-After", "1")))
                    response = await client.post(PROCESS_PATH, json=body)
                response.raise_for_status()
        async with asyncio.timeout(wait_seconds):
            while await core_side.count_unfinished(engine, ids):  # noqa: ASYNC110 - polls the database
                await asyncio.sleep(0.2)
        return await core_side.load_results(engine, ids)
    finally:
        await engine.dispose()


def render_results(samples: list[Sample], results: list[core_side.ContextResult]) -> str:
    rows = [
        [
            str(result.context_id),
            str(sample.user_id),
            sample.place,
            result.embedding_status,
            result.keyword_status,
            ", ".join(result.keywords) or "-",
        ]
        for sample, result in zip(samples, results, strict=True)
    ]
    headers = ["context", "user", "place", "embedding", "keyword", "keywords"]
    return table.render(headers, rows)


async def run_demo(*, port: int, serve: bool, data_dir: Path) -> int:
    """Run the demo; returns a process exit code (0 when every context completed)."""
    started = time.monotonic()
    given = DatabaseSettings()
    database_url = given.database_url
    if database_url is None:
        print(f"starting embedded PostgreSQL in {data_dir} ...", flush=True)
        database_url = embedded_postgres.start(data_dir)
    secret = given.internal_secret.get_secret_value() if given.internal_secret else None
    settings = offline_settings(database_url, secret)
    await prepare_database(settings)

    port = free_port(port)
    server = uvicorn.Server(
        uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    )
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            return await serving or 1
        await asyncio.sleep(0.05)
    base_url = f"http://127.0.0.1:{port}"

    samples = load_samples()
    results = await feed_and_report(settings, base_url, samples)
    print(render_results(samples, results))
    completed = sum(r.embedding_status == r.keyword_status == "COMPLETED" for r in results)
    with_keywords = sum(bool(r.keywords) for r in results)
    print(
        f"\n{len(results)} contexts: {completed} COMPLETED in both stages, "
        f"{with_keywords} with at least one keyword; "
        f"{time.monotonic() - started:.1f} s from start to this table."
    )
    if serve:
        print(f"worker serving on {base_url} (Ctrl-C to stop)", flush=True)
        if secret is None:
            # A throwaway development secret, so the API can be tried by hand.
            print(
                f"X-Internal-Secret for this run: {settings.internal_secret.get_secret_value()}",
                flush=True,
            )
    else:
        server.should_exit = True
    await serving
    return 0 if completed == len(results) else 1
