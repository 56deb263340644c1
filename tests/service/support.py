"""Helpers shared by the service tests: waiting on held calls, log filters, result reads."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.repository.db import to_array
from tests.fake_openai import Scripted
from tests.harness import RunningWorker

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
