"""Worker-side test helpers for the re-embedding backfill and for vectors per embedding profile
(0060): backfill rows as the core proposes them or a worker left them, another worker's claim
held open, reads of one context's vectors by profile, the column declared with one dimension as
before 0060, and the backfill request as the core sends it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx
import numpy as np
from sqlalchemy import text
from sqlalchemy import text as text_statement
from sqlalchemy.ext.asyncio import AsyncEngine

from app.repository.db import to_array
from app.repository.profile_vectors import CLAIM_BACKFILL, BackfillAsk, BackfillClaim
from pinlog_platform.contract.text_fingerprint import fingerprint
from tests.worker.harness import SECRET, RunningWorker
from tests.worker.support import PROFILE, context_rows

BACKFILL_PATH = "/internal/v1/backfill/embed"


# The owner and text a backfill row's context has when the test does not say (the state row
# make_backfill writes, as the core does on create).
BACKFILL_USER_ID = 7
BACKFILL_RECORD_ID = 70


def backfill_text(context_id: int) -> str:
    """The note of a context whose state row ``make_backfill`` wrote."""
    return f"backfill note {context_id}"


def ask(context_id: int, text: str | None = None) -> BackfillAsk:
    """What the core asks for a context ``make_backfill`` proposed: its text (``text`` or
    ``backfill_text``) and owner."""
    note = backfill_text(context_id) if text is None else text
    return BackfillAsk(context_id, fingerprint(note), BACKFILL_USER_ID, BACKFILL_RECORD_ID)


def claimed(context_id: int, attempt: int) -> BackfillClaim:
    """The claim of a context ``make_backfill`` proposed (its state row's owner)."""
    return BackfillClaim(context_id, attempt, BACKFILL_USER_ID, BACKFILL_RECORD_ID)


async def make_backfill(
    engine: AsyncEngine,
    *,
    context_id: int,
    profile: str = PROFILE,
    status: str = "PENDING",
    attempt: int = 0,
    failure_reason: str | None = None,
    updated_seconds_ago: float = 0,
    text: str | None = None,
) -> None:
    """A re-embedding backfill row of ``profile`` (0060) as the core proposes it (PENDING) or
    as a worker left it. Its context's state row gets what the core writes on create where it
    lacks it: the owner (``BACKFILL_USER_ID``/``BACKFILL_RECORD_ID``) and the digest of
    ``text`` (``backfill_text`` when ``None``); a missing state row is made ``COMPLETED``."""
    note = backfill_text(context_id) if text is None else text
    async with engine.begin() as conn:
        await conn.execute(
            text_statement(
                "INSERT INTO ai.context_ai_state (context_id, embedding_status, keyword_status, "
                "user_id, record_id, text_sha256, text_sha256_from_core) "
                "VALUES (:id, 'COMPLETED', 'COMPLETED', :u, :rec, :digest, true) "
                "ON CONFLICT (context_id) DO UPDATE SET "
                "user_id = coalesce(ai.context_ai_state.user_id, EXCLUDED.user_id), "
                "record_id = coalesce(ai.context_ai_state.record_id, EXCLUDED.record_id), "
                "text_sha256 = EXCLUDED.text_sha256, text_sha256_from_core = true"
            ),
            {
                "id": context_id,
                "u": BACKFILL_USER_ID,
                "rec": BACKFILL_RECORD_ID,
                "digest": fingerprint(note),
            },
        )
        await conn.execute(
            text_statement(
                "INSERT INTO ai.context_embedding_backfill (embedding_profile, context_id, "
                "status, attempt, failure_reason, updated_at) VALUES (:p, :id, :s, :a, :r, "
                "now() - make_interval(secs => :ago))"
            ),
            {
                "p": profile,
                "id": context_id,
                "s": status,
                "a": attempt,
                "r": failure_reason,
                "ago": float(updated_seconds_ago),
            },
        )


async def set_backfill(
    engine: AsyncEngine, profile: str, context_id: int, **columns: object
) -> None:
    """Write ``columns`` of the backfill row of ``profile`` for one context; ``*_ago`` values
    are seconds before now (``updated_at_ago=60``: untouched for a minute)."""
    assignments, params = [], {"p": profile, "id": context_id}
    for name, value in columns.items():
        if name.endswith("_ago"):
            column = name.removesuffix("_ago")
            assignments.append(f"{column} = now() - make_interval(secs => :{column})")
            params[column] = float(value)
        else:
            assignments.append(f"{name} = :{name}")
            params[name] = value
    async with engine.begin() as conn:
        await conn.execute(
            text(
                f"UPDATE ai.context_embedding_backfill SET {', '.join(assignments)} "
                "WHERE embedding_profile = :p AND context_id = :id"
            ),
            params,
        )


@dataclass(frozen=True)
class BackfillRow:
    status: str
    attempt: int
    failure_reason: str | None


async def backfill_row(engine: AsyncEngine, context_id: int, profile: str = PROFILE) -> BackfillRow:
    """The backfill row of ``profile`` for one context (which must exist)."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT status, attempt, failure_reason FROM ai.context_embedding_backfill "
                    "WHERE embedding_profile = :p AND context_id = :id"
                ),
                {"p": profile, "id": context_id},
            )
        ).one()
    return BackfillRow(row.status, row.attempt, row.failure_reason)


@dataclass
class OpenClaim:
    """Another worker's backfill claim, its transaction still open (its rows locked)."""

    transaction: asyncpg.transaction.Transaction
    claims: list[BackfillClaim]


@asynccontextmanager
async def claimed_in_open_transaction(
    session: asyncpg.Connection,
    context_ids: list[int],
    *,
    profile: str = PROFILE,
    expiry: float = 600,
    text: str | None = None,
) -> AsyncIterator[OpenClaim]:
    """Run the real ``CLAIM_BACKFILL`` of ``profile`` on ``session`` inside a transaction left
    open: the claimed rows stay locked until the caller commits or rolls back (rolled back if
    not). ``expiry``: seconds after which a PROCESSING row may be reclaimed; ``text``: the note
    sent for every context (``backfill_text`` of each when ``None``)."""
    transaction = session.transaction()
    await transaction.start()
    try:
        row = await session.fetchrow(
            CLAIM_BACKFILL.sql,
            *CLAIM_BACKFILL.bind(
                {
                    "embedding_profile": profile,
                    "context_ids": sorted(context_ids),
                    "text_sha256s": [ask(c, text).text_sha256 for c in sorted(context_ids)],
                    "user_ids": [BACKFILL_USER_ID] * len(context_ids),
                    "record_ids": [BACKFILL_RECORD_ID] * len(context_ids),
                    "expiry_seconds": float(expiry),
                }
            ),
        )
        claims = [
            BackfillClaim(int(c), int(a), int(u), int(r))
            for c, a, u, r in zip(
                row["context_ids"],
                row["attempts"],
                row["user_ids"],
                row["record_ids"],
                strict=True,
            )
        ]
        yield OpenClaim(transaction, claims)
    finally:
        if session.is_in_transaction():
            await transaction.rollback()


async def vector_rows(engine: AsyncEngine, context_id: int) -> dict[str, dict[str, Any]]:
    """Every row of one context in ``ai.context_embedding``, by profile (all columns, the
    vector as an array)."""
    rows = await context_rows(engine, "ai.context_embedding", context_id)
    return {
        row["embedding_profile"]: {**row, "embedding": to_array(row["embedding"])} for row in rows
    }


async def vectors_by_profile(engine: AsyncEngine, context_id: int) -> dict[str, np.ndarray]:
    """``{embedding_profile: vector}`` of one context."""
    rows = await vector_rows(engine, context_id)
    return {profile: row["embedding"] for profile, row in rows.items()}


@asynccontextmanager
async def context_vectors_declared(engine: AsyncEngine, dimension: int) -> AsyncIterator[None]:
    """``ai.context_embedding.embedding`` declared ``VECTOR(dimension)`` for the block, as a
    schema before 0060 declared it (the table must hold no vector of another dimension), then
    undeclared again."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "ALTER TABLE ai.context_embedding ALTER COLUMN embedding "
                "TYPE vector(" + str(int(dimension)) + ")"
            )
        )
    try:
        yield
    finally:
        async with engine.begin() as conn:
            await conn.execute(
                text("ALTER TABLE ai.context_embedding ALTER COLUMN embedding TYPE vector")
            )


async def post_backfill(
    worker: RunningWorker,
    contexts: list[dict[str, Any]],
    *,
    profile: str | None = None,
    secret: str | None = SECRET,
) -> httpx.Response:
    """``POST /internal/v1/backfill/embed`` of ``contexts`` (``contextId``, ``userId``,
    ``recordId``, ``text`` each) for ``profile`` (``None``: the worker's own)."""
    headers = {} if secret is None else {"X-Internal-Secret": secret}
    body = {"embeddingProfile": profile or worker.settings.embedding_profile, "contexts": contexts}
    return await worker.client.post(BACKFILL_PATH, json=body, headers=headers)


def backfill_counts(
    completed: int = 0,
    cancelled: int = 0,
    failed: int = 0,
    not_claimed: int = 0,
    lost: int = 0,
    put_back: int = 0,
) -> dict[str, int]:
    """The body of a backfill's 200: the batch's contexts counted by result."""
    return {
        "completed": completed,
        "cancelled": cancelled,
        "failed": failed,
        "notClaimed": not_claimed,
        "lost": lost,
        "putBack": put_back,
    }
