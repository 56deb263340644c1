"""The two save transactions of §3: lock, re-check, write, transition, commit.

Nothing but SQL runs between ``FOR UPDATE`` and ``COMMIT`` (§3.4). A failed re-check rolls back
and reports ``DISCARDED``: a late result for a deleted or replaced context is a normal outcome.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

import numpy as np
from sqlalchemy.ext.asyncio import AsyncEngine

from app.repository import (
    context_ai_state,
    context_embedding,
    context_keyword,
    context_keyword_analysis,
)
from app.repository.db import transaction
from app.states import Stage


class SaveOutcome(StrEnum):
    SAVED = "SAVED"
    DISCARDED = "DISCARDED"


class _Discard(Exception):
    """Rolls the save transaction back; never leaves this module."""


async def save_embedding(
    engine: AsyncEngine,
    *,
    context_id: int,
    attempt: int,
    user_id: int,
    record_id: int,
    embedding: np.ndarray,
    embedding_profile: str,
) -> SaveOutcome:
    """Store the vector and mark the embedding stage ``COMPLETED`` if it is still ours (§3.2).

    ``attempt``: the claim's fencing token; a superseded attempt is discarded.
    ``embedding``: float32, shape ``(dimension,)``. Raises ``TransientError`` on database loss.
    """
    try:
        async with transaction(engine) as conn:
            locked = await context_ai_state.lock_for_save(conn, context_id)
            if locked is None or not locked.owns(Stage.EMBEDDING, attempt):
                raise _Discard
            await context_embedding.upsert(
                conn,
                context_id=context_id,
                user_id=user_id,
                record_id=record_id,
                embedding=embedding,
                embedding_profile=embedding_profile,
            )
            if (
                await context_ai_state.complete(conn, Stage.EMBEDDING, context_id, attempt=attempt)
                != 1
            ):
                raise _Discard
    except _Discard:
        return SaveOutcome.DISCARDED
    return SaveOutcome.SAVED


async def save_keywords(
    engine: AsyncEngine,
    *,
    context_id: int,
    attempt: int,
    selections: Sequence[tuple[int, float]],
    preset_version: int,
    unmatched_concepts: Sequence[str],
    model_profile: str,
) -> SaveOutcome:
    """Replace the context's keywords, write the analysis, mark keyword ``COMPLETED`` (§3.3).

    ``selections``: ``(keyword_id, confidence 0..1)`` pairs, zero allowed. Requires
    ``embedding_status = COMPLETED AND keyword_status = PROCESSING`` and ``keyword_attempt =
    attempt`` under the row lock.
    """
    try:
        async with transaction(engine) as conn:
            locked = await context_ai_state.lock_for_save(conn, context_id)
            if locked is None or not locked.owns(Stage.KEYWORD, attempt):
                raise _Discard
            await context_keyword.replace(
                conn, context_id=context_id, selections=selections, preset_version=preset_version
            )
            await context_keyword_analysis.upsert(
                conn,
                context_id=context_id,
                preset_version=preset_version,
                unmatched_concepts=unmatched_concepts,
                model_profile=model_profile,
            )
            if (
                await context_ai_state.complete(conn, Stage.KEYWORD, context_id, attempt=attempt)
                != 1
            ):
                raise _Discard
    except _Discard:
        return SaveOutcome.DISCARDED
    return SaveOutcome.SAVED
