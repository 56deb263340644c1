"""Worker-side test helpers: data builders with keyword-only arguments (they write rows as the
core side would), reads of stored results, waiting on held fake-provider calls, log filters and
HTTP requests as the core sends them. The backfill and vectors per profile are in
``backfill_support``; transactions held open and lock waits in ``open_transactions``."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.providers.hashing import hash_embed
from app.repository.db import to_array
from pinlog_platform.contract.text_fingerprint import fingerprint
from tests.fake_openai import Scripted
from tests.worker.harness import PROCESS_PATH, SECRET, RunningWorker

DIMENSION = 1536
PROFILE = "local-hashing-char-ngram-1536-cosine-v1"


def vector(seed: int | str = 1, *, dimension: int = DIMENSION) -> np.ndarray:
    """A deterministic unit vector, float32 shape ``(dimension,)``."""
    return hash_embed(f"builder vector {seed}", dimension)


async def make_state(
    engine: AsyncEngine,
    *,
    context_id: int,
    embedding_status: str = "PENDING",
    keyword_status: str = "PENDING",
    retry_count: int = 0,
    updated_seconds_ago: float = 0,
    user_id: int | None = None,
    record_id: int | None = None,
    core_text: str | None = None,
) -> None:
    """Insert a state row as the core side does on create (§9); ``user_id``/``record_id``
    ``None`` is a core side following the original contract (no owner columns written).
    ``core_text``: the text whose digest the core wrote (§3 scenario 5); ``None``: no digest."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO ai.context_ai_state (context_id, embedding_status, keyword_status, "
                "retry_count, updated_at, user_id, record_id, text_sha256, "
                "text_sha256_from_core) "
                "VALUES (:id, :e, :k, :r, now() - make_interval(secs => :ago), :u, :rec, "
                ":digest, :from_core)"
            ),
            {
                "digest": None if core_text is None else fingerprint(core_text),
                "from_core": core_text is not None,
                "id": context_id,
                "u": user_id,
                "rec": record_id,
                "e": embedding_status,
                "k": keyword_status,
                "r": retry_count,
                "ago": float(updated_seconds_ago),
            },
        )


async def make_embedding(
    engine: AsyncEngine,
    *,
    context_id: int,
    user_id: int = 1,
    record_id: int = 1,
    embedding: np.ndarray | None = None,
    profile: str = PROFILE,
    is_deleted: bool = False,
) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO ai.context_embedding "
                "(context_id, user_id, record_id, embedding, embedding_profile, is_deleted) "
                "VALUES (:id, :u, :r, :v, :p, :d)"
            ),
            {
                "id": context_id,
                "u": user_id,
                "r": record_id,
                "v": vector(context_id) if embedding is None else embedding,
                "p": profile,
                "d": is_deleted,
            },
        )


async def make_preset(
    engine: AsyncEngine,
    *,
    preset_id: int,
    code: str | None = None,
    display_name: str = "프리셋",
    category: str = "ACTIVITY",
    description: str = "설명",
    examples: tuple[str, ...] = ("예시 하나", "예시 둘", "예시 셋"),
    embedding: np.ndarray | None = None,
    profile: str | None = PROFILE,
    visibility: str = "PUBLIC",
    is_active: bool = True,
    version: int = 1,
    vector_version: int | None = None,
) -> None:
    """A preset's shared row and, unless ``profile`` is ``None``, its vector of ``profile``
    embedded from revision ``vector_version`` (default: ``version``, a current vector)."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO ai.keyword_preset (id, code, display_name, category, description, "
                "examples, visibility, is_active, version) "
                "VALUES (:id, :code, :name, :cat, :desc, :ex, :vis, :active, :ver)"
            ),
            {
                "id": preset_id,
                "code": code or f"PRESET_{preset_id}",
                "name": display_name,
                "cat": category,
                "desc": description,
                "ex": list(examples),
                "vis": visibility,
                "active": is_active,
                "ver": version,
            },
        )
        if profile is not None:
            await make_preset_vector(
                conn,
                preset_id=preset_id,
                profile=profile,
                embedding=embedding,
                version=version if vector_version is None else vector_version,
            )


async def make_preset_vector(
    conn: AsyncConnection,
    *,
    preset_id: int,
    profile: str = PROFILE,
    embedding: np.ndarray | None = None,
    version: int = 1,
) -> None:
    """A preset's vector of ``profile``, embedded from revision ``version``."""
    await conn.execute(
        text(
            "INSERT INTO ai.keyword_preset_embedding "
            "(preset_id, embedding_profile, embedding, preset_version) VALUES (:id, :p, :v, :ver)"
        ),
        {
            "id": preset_id,
            "p": profile,
            "v": vector(f"preset {preset_id}") if embedding is None else embedding,
            "ver": version,
        },
    )


async def make_keyword(
    engine: AsyncEngine,
    *,
    context_id: int,
    keyword_id: int,
    confidence: float = 0.8,
    preset_version: int = 1,
) -> None:
    """A keyword row left by an earlier judgment."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO ai.context_keyword (context_id, keyword_id, confidence, "
                "preset_version) VALUES (:id, :k, :c, :v)"
            ),
            {"id": context_id, "k": keyword_id, "c": confidence, "v": preset_version},
        )


async def fetch_state(engine: AsyncEngine, context_id: int) -> tuple[str, str]:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT embedding_status, keyword_status FROM ai.context_ai_state "
                    "WHERE context_id = :id"
                ),
                {"id": context_id},
            )
        ).one()
    return row.embedding_status, row.keyword_status


async def failure_reasons(engine: AsyncEngine, context_id: int) -> tuple[str | None, str | None]:
    """``(embedding_failure, keyword_failure)`` of one state row."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT embedding_failure, keyword_failure FROM ai.context_ai_state "
                    "WHERE context_id = :id"
                ),
                {"id": context_id},
            )
        ).one()
    return row.embedding_failure, row.keyword_failure


async def context_rows(engine: AsyncEngine, table: str, context_id: int) -> list[dict[str, Any]]:
    """Every column of ``table``'s rows of one context (``table``: a test constant)."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(f"SELECT * FROM {table} WHERE context_id = :id"), {"id": context_id}
        )
        return [dict(row._mapping) for row in rows]


async def state_row(engine: AsyncEngine, context_id: int) -> dict[str, Any]:
    """Every column of one state row (to show a statement left it alone)."""
    (row,) = await context_rows(engine, "ai.context_ai_state", context_id)
    return row


async def count_rows(engine: AsyncEngine, table: str, context_id: int) -> int:
    async with engine.connect() as conn:
        return (
            await conn.execute(
                text(f"SELECT count(*) FROM {table} WHERE context_id = :id"), {"id": context_id}
            )
        ).scalar_one()


async def set_statuses(
    engine: AsyncEngine,
    *,
    context_id: int,
    embedding_status: str,
    keyword_status: str,
    retry_count: int | None = None,
) -> None:
    """Move an existing state row to the given statuses (and retry count), as finished or
    crashed work would leave it."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE ai.context_ai_state SET embedding_status = :e, keyword_status = :k, "
                "retry_count = coalesce(:r, retry_count), updated_at = now() "
                "WHERE context_id = :id"
            ),
            {"id": context_id, "e": embedding_status, "k": keyword_status, "r": retry_count},
        )


ENTER_TIMEOUT_SECONDS = 10


async def arrived(scripted: Scripted) -> None:
    """Wait (off the event loop) until the held call reached the fake provider."""
    entered = await asyncio.to_thread(scripted.entered.wait, ENTER_TIMEOUT_SECONDS)
    assert entered, "the provider call never arrived"


async def start_held(
    worker: RunningWorker,
    script: Callable[[Scripted], None],
    held: Scripted,
    context_id: int,
    text: str,
) -> asyncio.Task[None]:
    """Start processing with ``held`` scripted as the next provider answer; return the task
    once that call is in flight (``script``: ``fake.script_embeddings`` or ``script_judge``).
    """
    script(held)
    task = asyncio.create_task(worker.process(context_id, text))
    await arrived(held)
    return task


def release(scripted: Scripted) -> None:
    assert scripted.block is not None
    scripted.block.set()


def app_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    """Records of exactly ``level`` written by our own loggers (names ``app.*``)."""
    return [r for r in caplog.records if r.name.startswith("app.") and r.levelno == level]


def records_at_least(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    """Records of ``level`` or above from any logger."""
    return [r for r in caplog.records if r.levelno >= level]


@dataclass(frozen=True)
class StoredEmbedding:
    embedding: np.ndarray
    profile: str
    is_deleted: bool


@dataclass(frozen=True)
class StoredAnalysis:
    preset_version: int
    unmatched_concepts: list[str]
    model_profile: str


async def stored_embedding(engine: AsyncEngine, context_id: int) -> StoredEmbedding | None:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT embedding, embedding_profile, is_deleted FROM ai.context_embedding "
                    "WHERE context_id = :id"
                ),
                {"id": context_id},
            )
        ).one_or_none()
    if row is None:
        return None
    embedding = to_array(row.embedding)
    assert embedding is not None
    return StoredEmbedding(embedding, row.embedding_profile, row.is_deleted)


async def keyword_rows(engine: AsyncEngine, context_id: int) -> dict[int, tuple[float, int]]:
    """``{keyword_id: (confidence, preset_version)}`` of one context."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT keyword_id, confidence, preset_version FROM ai.context_keyword "
                "WHERE context_id = :id"
            ),
            {"id": context_id},
        )
        return {row.keyword_id: (float(row.confidence), row.preset_version) for row in rows}


async def stored_analysis(engine: AsyncEngine, context_id: int) -> StoredAnalysis | None:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT preset_version, unmatched_concepts, model_profile "
                    "FROM ai.context_keyword_analysis WHERE context_id = :id"
                ),
                {"id": context_id},
            )
        ).one_or_none()
    if row is None:
        return None
    return StoredAnalysis(row.preset_version, list(row.unmatched_concepts), row.model_profile)


async def state_updated_at(engine: AsyncEngine, context_id: int) -> Any:
    async with engine.connect() as conn:
        return (
            await conn.execute(
                text("SELECT updated_at FROM ai.context_ai_state WHERE context_id = :id"),
                {"id": context_id},
            )
        ).scalar_one()


async def backdate(engine: AsyncEngine, context_id: int, *, seconds: float) -> None:
    """Make the state row look untouched for ``seconds`` (a worker that died, §10 #8)."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE ai.context_ai_state "
                "SET updated_at = now() - make_interval(secs => :ago) WHERE context_id = :id"
            ),
            {"id": context_id, "ago": float(seconds)},
        )


async def preset_ids(engine: AsyncEngine, where: str = "true") -> set[int]:
    """Ids of stored presets matching the SQL condition ``where`` (a test constant)."""
    async with engine.connect() as conn:
        rows = await conn.execute(text(f"SELECT id FROM ai.keyword_preset WHERE {where}"))
        return {row.id for row in rows}


EVENT_TIMEOUT_SECONDS = 10.0


async def post_raw(worker: RunningWorker, raw: str) -> httpx.Response:
    """POST ``raw`` verbatim as the JSON body, so float literals and escapes arrive as written."""
    return await worker.client.post(
        PROCESS_PATH,
        content=raw.encode(),
        headers={"X-Internal-Secret": SECRET, "Content-Type": "application/json"},
    )


async def wait_for(event: threading.Event) -> None:
    """Wait for a fake-provider event without blocking the event loop the worker runs on."""
    if not await asyncio.to_thread(event.wait, EVENT_TIMEOUT_SECONDS):
        raise AssertionError(f"event not set within {EVENT_TIMEOUT_SECONDS} s")


async def process_request(
    worker: RunningWorker,
    *,
    context_id: int,
    text: str,
    profile: str | None = None,
    user_id: int = 7,
    record_id: int = 70,
) -> httpx.Response:
    """The core's process request naming ``profile`` (``None``: the worker's own); the answer,
    once the worker handled every queued request."""
    response = await worker.post(
        {
            "contextId": context_id,
            "userId": user_id,
            "recordId": record_id,
            "text": text,
            "embeddingProfile": profile or worker.settings.embedding_profile,
        }
    )
    await worker.drain()
    return response
