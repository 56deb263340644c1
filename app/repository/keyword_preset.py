"""``ai.keyword_preset``: the preset list the judge chooses from (§4).

Retired presets are ``is_active = false``, never deleted. ``version`` is the revision of the
whole list: every row written by one load carries the same number.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.repository.db import to_array


@dataclass(frozen=True, slots=True)
class PresetRow:
    """One stored preset; ``embedding`` is float32 of shape ``(dimension,)``."""

    id: int
    code: str
    display_name: str
    category: str
    description: str
    examples: tuple[str, ...]
    embedding: np.ndarray
    embedding_profile: str
    visibility: str
    is_active: bool
    version: int


_COLUMNS = (
    "id, code, display_name, category, description, examples, embedding, "
    "embedding_profile, visibility, is_active, version"
)

# Presets the worker may offer as candidates: active, current profile, not BLOCKED (§4).
LOAD_USABLE_PRESETS = text(
    f"SELECT {_COLUMNS} FROM ai.keyword_preset "  # noqa: S608 - constant column list
    "WHERE is_active AND embedding_profile = :profile AND visibility <> 'BLOCKED' ORDER BY id"
)

# Every stored preset, for comparing a preset file with the database.
LOAD_ALL_PRESETS = text(f"SELECT {_COLUMNS} FROM ai.keyword_preset ORDER BY id")  # noqa: S608

# Insert or update one preset by id; code is immutable so it is not in the SET list.
UPSERT_PRESET = text(
    """
    INSERT INTO ai.keyword_preset
        (id, code, display_name, category, description, examples, embedding,
         embedding_profile, visibility, is_active, version)
    VALUES (:id, :code, :display_name, :category, :description, :examples, :embedding,
            :embedding_profile, :visibility, :is_active, :version)
    ON CONFLICT (id) DO UPDATE SET
        display_name = EXCLUDED.display_name,
        category = EXCLUDED.category,
        description = EXCLUDED.description,
        examples = EXCLUDED.examples,
        embedding = EXCLUDED.embedding,
        embedding_profile = EXCLUDED.embedding_profile,
        visibility = EXCLUDED.visibility,
        is_active = EXCLUDED.is_active,
        version = EXCLUDED.version
    """
)

# Retire presets no longer in the list (never delete: keyword rows reference them).
RETIRE_PRESETS_NOT_IN = text(
    """
    UPDATE ai.keyword_preset SET is_active = false, version = :version
    WHERE is_active AND NOT (id = ANY(CAST(:kept_ids AS int[])))
    """
)


def _to_row(row) -> PresetRow:
    return PresetRow(
        id=row.id,
        code=row.code,
        display_name=row.display_name,
        category=row.category,
        description=row.description,
        examples=tuple(row.examples),
        embedding=to_array(row.embedding),
        embedding_profile=row.embedding_profile,
        visibility=row.visibility,
        is_active=row.is_active,
        version=row.version,
    )


async def load_usable(conn: AsyncConnection, profile: str) -> list[PresetRow]:
    """Active, non-BLOCKED presets whose embedding uses ``profile``, ordered by id."""
    result = await conn.execute(LOAD_USABLE_PRESETS, {"profile": profile})
    return [_to_row(row) for row in result]


async def load_all(conn: AsyncConnection) -> list[PresetRow]:
    """Every stored preset, retired and BLOCKED included, ordered by id."""
    return [_to_row(row) for row in await conn.execute(LOAD_ALL_PRESETS)]


async def upsert_all(conn: AsyncConnection, presets: Sequence[PresetRow]) -> None:
    """Insert or update ``presets`` by id (one statement, executed per row)."""
    if not presets:
        return
    await conn.execute(
        UPSERT_PRESET,
        [
            {
                "id": p.id,
                "code": p.code,
                "display_name": p.display_name,
                "category": p.category,
                "description": p.description,
                "examples": list(p.examples),
                "embedding": p.embedding,
                "embedding_profile": p.embedding_profile,
                "visibility": p.visibility,
                "is_active": p.is_active,
                "version": p.version,
            }
            for p in presets
        ],
    )


async def retire_missing(conn: AsyncConnection, *, kept_ids: Sequence[int], version: int) -> int:
    """Mark active presets whose id is not in ``kept_ids`` retired; returns rows affected."""
    result = await conn.execute(
        RETIRE_PRESETS_NOT_IN, {"kept_ids": list(kept_ids), "version": version}
    )
    return result.rowcount
