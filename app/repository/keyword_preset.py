"""``ai.keyword_preset``: the preset list the judge chooses from (§4).

Retired presets are ``is_active = false``, never deleted. ``version`` is the revision of the
whole list: every row written by one load carries the same number.

``PresetRow`` is the one place the columns are named: the statements' column lists are derived
from its fields, and a test checks them against the migrated table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.repository.db import to_array


@dataclass(frozen=True, slots=True)
class PresetRow:
    """One stored preset, fields in table column order; ``embedding`` is float32 of shape
    ``(dimension,)``."""

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


# The column names, in table order. The statements below are joined from these once, at
# import: they are identifiers written in this module, never input, and every value still
# travels as a bind parameter.
COLUMNS = tuple(field.name for field in fields(PresetRow))
# What an upsert never changes: the conflict key, and the code, which is immutable (§4).
_NOT_UPDATED = ("id", "code")

_SELECT_PRESETS = "SELECT " + ", ".join(COLUMNS) + " FROM ai.keyword_preset"

# Presets the worker may offer as candidates: active, current profile, not BLOCKED (§4).
LOAD_USABLE_PRESETS = text(
    _SELECT_PRESETS
    + " WHERE is_active AND embedding_profile = :profile AND visibility <> 'BLOCKED'"
    + " ORDER BY id"
)

# Every stored preset, for comparing a preset file with the database.
LOAD_ALL_PRESETS = text(_SELECT_PRESETS + " ORDER BY id")

# Insert or update one preset by id; every column but id and code is overwritten.
UPSERT_PRESET = text(
    "INSERT INTO ai.keyword_preset ("
    + ", ".join(COLUMNS)
    + ")\nVALUES ("
    + ", ".join(":" + column for column in COLUMNS)
    + ")\nON CONFLICT (id) DO UPDATE SET "
    + ", ".join(
        column + " = EXCLUDED." + column for column in COLUMNS if column not in _NOT_UPDATED
    )
)

# Retire presets no longer in the list (never delete: keyword rows reference them).
RETIRE_PRESETS_NOT_IN = text(
    """
    UPDATE ai.keyword_preset SET is_active = false, version = :version
    WHERE is_active AND NOT (id = ANY(CAST(:kept_ids AS int[])))
    """
)


def _from_db(row) -> PresetRow:
    """A result row as ``PresetRow``: the driver returns ``examples`` as a list and the
    vector as pgvector's type."""
    values = dict(row._mapping)
    values["examples"] = tuple(values["examples"])
    values["embedding"] = to_array(values["embedding"])
    return PresetRow(**values)


def _to_db(preset: PresetRow) -> dict[str, object]:
    """The bind parameters of ``UPSERT_PRESET``: one per column, ``examples`` as a list."""
    values = {column: getattr(preset, column) for column in COLUMNS}
    values["examples"] = list(preset.examples)
    return values


async def load_usable(conn: AsyncConnection, profile: str) -> list[PresetRow]:
    """Active, non-BLOCKED presets whose embedding uses ``profile``, ordered by id."""
    result = await conn.execute(LOAD_USABLE_PRESETS, {"profile": profile})
    return [_from_db(row) for row in result]


async def load_all(conn: AsyncConnection) -> list[PresetRow]:
    """Every stored preset, retired and BLOCKED included, ordered by id."""
    return [_from_db(row) for row in await conn.execute(LOAD_ALL_PRESETS)]


async def upsert_all(conn: AsyncConnection, presets: Sequence[PresetRow]) -> None:
    """Insert or update ``presets`` by id (one statement, executed per row)."""
    if not presets:
        return
    await conn.execute(UPSERT_PRESET, [_to_db(p) for p in presets])


async def retire_missing(conn: AsyncConnection, *, kept_ids: Sequence[int], version: int) -> int:
    """Mark active presets whose id is not in ``kept_ids`` retired; returns rows affected."""
    result = await conn.execute(
        RETIRE_PRESETS_NOT_IN, {"kept_ids": list(kept_ids), "version": version}
    )
    return result.rowcount
