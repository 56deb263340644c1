"""``ai.keyword_preset`` and ``ai.keyword_preset_embedding``: the preset list the judge chooses
from and each profile's vectors of it (§4; per-profile vectors: §1 Deviation, docs/contract.md).

A preset's shared fields (``PresetDefinition``: id, code, names, examples, visibility, active,
``version``) are one row every profile shares; ``version`` is the revision of the whole list:
every row written by one changing load carries the same number. A profile's vector of a preset
is a row of its own, stamped with the revision it embedded (``preset_version``); writing one
profile's vectors never touches another's. ``PresetRow`` is a preset as a worker of one
profile sees it: the definition with that profile's vector.

``PresetDefinition`` is the one place the shared columns are named and ``PresetRow`` adds the
vector: the statements' column lists are derived from their fields, and a test checks them
against the migrated tables. Which presets a worker may use is
``pinlog_platform.contract.preset_list``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from app.repository.db import to_array
from pinlog_platform.contract.preset_list import USABLE_PRESETS


@dataclass(frozen=True, slots=True)
class PresetDefinition:
    """One row of ``ai.keyword_preset`` as every profile shares it; fields in table column
    order, without the columns frozen by ``0050_keyword_preset_embedding.sql``."""

    id: int
    code: str
    display_name: str
    category: str
    description: str
    examples: tuple[str, ...]
    visibility: str
    is_active: bool
    version: int


@dataclass(frozen=True, slots=True)
class PresetRow(PresetDefinition):
    """A preset with its vector of ``embedding_profile`` (float32 of shape ``(dimension,)``),
    embedded from revision ``version``."""

    embedding: np.ndarray
    embedding_profile: str

    def definition(self) -> PresetDefinition:
        """The shared fields alone."""
        return PresetDefinition(**{name: getattr(self, name) for name in DEFINITION_COLUMNS})


# The shared column names, in table order; the vector's, as PresetRow adds them. The statements
# below are joined from these once, at import: identifiers written in this module, never input,
# and every value still travels as a bind parameter.
DEFINITION_COLUMNS = tuple(field.name for field in fields(PresetDefinition))
VECTOR_FIELDS = ("embedding", "embedding_profile")
# What an upsert of a definition never changes: the conflict key, and the immutable code (§4).
_NOT_UPDATED = ("id", "code")

# The presets usable under :profile with their vectors (pinlog_platform.contract.preset_list), by
# id.
LOAD_USABLE_PRESETS = text(
    "SELECT "
    + ", ".join(
        ["p." + column for column in DEFINITION_COLUMNS] + ["e." + f for f in VECTOR_FIELDS]
    )
    + USABLE_PRESETS
    + "ORDER BY p.id"
)

# Every stored preset's shared fields, for comparing a preset file with the database.
LOAD_DEFINITIONS = text(
    "SELECT " + ", ".join(DEFINITION_COLUMNS) + " FROM ai.keyword_preset ORDER BY id"
)

# Every preset that has a vector of :profile (of any revision), with it, by id.
LOAD_PROFILE_PRESETS = text(
    "SELECT "
    + ", ".join(
        ["p." + column for column in DEFINITION_COLUMNS] + ["e." + f for f in VECTOR_FIELDS]
    )
    + " FROM ai.keyword_preset AS p JOIN ai.keyword_preset_embedding AS e"
    + " ON e.preset_id = p.id AND e.embedding_profile = :profile ORDER BY p.id"
)

# The revision each preset's vector of :profile was embedded from.
LOAD_VECTOR_VERSIONS = text(
    "SELECT preset_id, preset_version FROM ai.keyword_preset_embedding"
    " WHERE embedding_profile = :profile"
)

# Insert or update one preset's shared fields by id; every column but id and code is
# overwritten.
UPSERT_DEFINITION = text(
    "INSERT INTO ai.keyword_preset ("
    + ", ".join(DEFINITION_COLUMNS)
    + ")\nVALUES ("
    + ", ".join(":" + column for column in DEFINITION_COLUMNS)
    + ")\nON CONFLICT (id) DO UPDATE SET "
    + ", ".join(
        column + " = EXCLUDED." + column
        for column in DEFINITION_COLUMNS
        if column not in _NOT_UPDATED
    )
)

# Insert or replace one preset's vector of one profile, embedded from revision :version.
UPSERT_VECTOR = text(
    """
    INSERT INTO ai.keyword_preset_embedding
        (preset_id, embedding_profile, embedding, preset_version, updated_at)
    VALUES (:id, :embedding_profile, :embedding, :version, now())
    ON CONFLICT (preset_id, embedding_profile) DO UPDATE SET
        embedding = EXCLUDED.embedding,
        preset_version = EXCLUDED.preset_version,
        updated_at = now()
    """
)

# Retire presets no longer in the list (never delete: keyword rows reference them).
RETIRE_PRESETS_NOT_IN = text(
    """
    UPDATE ai.keyword_preset SET is_active = false, version = :version
    WHERE is_active AND NOT (id = ANY(CAST(:kept_ids AS int[])))
    """
)


def _definition_values(row) -> dict[str, object]:
    """A result row's shared fields; the driver returns ``examples`` as a list."""
    values = {column: getattr(row, column) for column in DEFINITION_COLUMNS}
    values["examples"] = tuple(values["examples"])
    return values


def _preset_from_db(row) -> PresetRow:
    """A result row of a statement selecting the definition and the vector as ``PresetRow``;
    the driver returns the vector as pgvector's type."""
    return PresetRow(
        **_definition_values(row),
        embedding=to_array(row.embedding),
        embedding_profile=row.embedding_profile,
    )


def _definition_to_db(preset: PresetDefinition) -> dict[str, object]:
    """The bind parameters of ``UPSERT_DEFINITION``: one per column, ``examples`` as a list."""
    values = {column: getattr(preset, column) for column in DEFINITION_COLUMNS}
    values["examples"] = list(preset.examples)
    return values


def _vector_to_db(preset: PresetRow) -> dict[str, object]:
    """The bind parameters of ``UPSERT_VECTOR``."""
    return {
        "id": preset.id,
        "embedding_profile": preset.embedding_profile,
        "embedding": preset.embedding,
        "version": preset.version,
    }


# Serialises the writes of preset loads (``presets load``): held by the writing transaction,
# which re-reads the list under it, so two loads never both write the same list version.
LOCK_PRESET_LIST = text("SELECT pg_advisory_xact_lock(hashtext('pinlog-ai/keyword_preset_list'))")


async def lock_list(conn: AsyncConnection) -> None:
    """Wait for, then hold until the transaction ends, the preset list's write lock (bounded by
    the connection's command deadline)."""
    await conn.execute(LOCK_PRESET_LIST)


async def load_usable(conn: AsyncConnection, profile: str) -> list[PresetRow]:
    """The presets usable under ``profile`` (active, not BLOCKED, with a current vector of the
    profile: ``pinlog_platform.contract.preset_list``), ordered by id."""
    result = await conn.execute(LOAD_USABLE_PRESETS, {"profile": profile})
    return [_preset_from_db(row) for row in result]


async def load_definitions(conn: AsyncConnection) -> list[PresetDefinition]:
    """Every stored preset's shared fields, retired and BLOCKED included, ordered by id."""
    return [
        PresetDefinition(**_definition_values(row)) for row in await conn.execute(LOAD_DEFINITIONS)
    ]


async def load_profile(conn: AsyncConnection, profile: str) -> list[PresetRow]:
    """Every preset that has a vector of ``profile``, whatever its revision, with it, by id
    (``version`` is the preset's current revision, not the vector's)."""
    result = await conn.execute(LOAD_PROFILE_PRESETS, {"profile": profile})
    return [_preset_from_db(row) for row in result]


async def vector_versions(conn: AsyncConnection, profile: str) -> dict[int, int]:
    """``{preset_id: revision its vector of profile was embedded from}``."""
    result = await conn.execute(LOAD_VECTOR_VERSIONS, {"profile": profile})
    return {int(row.preset_id): int(row.preset_version) for row in result}


async def upsert_definitions(conn: AsyncConnection, presets: Sequence[PresetDefinition]) -> None:
    """Insert or update the shared fields of ``presets`` by id; no vector is touched."""
    if presets:
        await conn.execute(UPSERT_DEFINITION, [_definition_to_db(p) for p in presets])


async def upsert_vectors(conn: AsyncConnection, presets: Sequence[PresetRow]) -> None:
    """Insert or replace each preset's vector of its ``embedding_profile``, stamped with its
    ``version``; vectors of other profiles are never touched."""
    if presets:
        await conn.execute(UPSERT_VECTOR, [_vector_to_db(p) for p in presets])


async def upsert_all(conn: AsyncConnection, presets: Sequence[PresetRow]) -> None:
    """``upsert_definitions`` then ``upsert_vectors`` for ``presets``."""
    await upsert_definitions(conn, presets)
    await upsert_vectors(conn, presets)


async def retire_missing(conn: AsyncConnection, *, kept_ids: Sequence[int], version: int) -> int:
    """Mark active presets whose id is not in ``kept_ids`` retired; returns rows affected."""
    result = await conn.execute(
        RETIRE_PRESETS_NOT_IN, {"kept_ids": list(kept_ids), "version": version}
    )
    return result.rowcount
