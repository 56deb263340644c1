"""``pinlog-ai presets load``: embed the preset file with the current profile and upsert it (§4).

The preset file is validated strictly (``PresetFileError`` names the field). When nothing
changed (content and profile), nothing is embedded or written. Otherwise every preset in the
file is embedded in one provider call and written with list version ``max(stored) + 1``;
active presets missing from the file are retired (``is_active = false``), never deleted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from sqlalchemy.ext.asyncio import AsyncEngine

from app.providers.base import EmbeddingProvider
from app.repository import keyword_preset
from app.repository.db import transaction
from app.repository.keyword_preset import PresetRow
from app.service.vector_columns import check_vector_columns

logger = logging.getLogger(__name__)

DEFAULT_PRESET_FILE = Path(__file__).resolve().parents[1] / "presets" / "keyword_presets.yaml"


class PresetFileError(ValueError):
    """The preset file is not valid YAML of the documented shape."""


class PresetEntry(BaseModel):
    """One preset of the file: the fields of ``PresetRow`` but those a load supplies
    (``embedding``, ``embedding_profile``, ``version``), with the file's rules."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: int = Field(ge=1, le=2**31 - 1)
    code: str = Field(pattern=r"^[A-Z][A-Z0-9_]*$", max_length=50)
    display_name: str = Field(min_length=1, max_length=50)
    category: Literal["COMPANION", "ACTIVITY", "ATMOSPHERE", "SITUATION"]
    description: str = Field(min_length=1)
    examples: tuple[str, ...] = Field(min_length=3)
    visibility: Literal["PUBLIC", "PRIVATE_ONLY", "BLOCKED"] = "PUBLIC"
    is_active: bool = True

    def embedding_input(self) -> str:
        """The text embedded for this preset; changing its shape needs a new profile (§5)."""
        return f"{self.display_name}. {self.description} 예: {' / '.join(self.examples)}"


class PresetFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = Field(ge=1)
    presets: tuple[PresetEntry, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> PresetFile:
        for attribute in ("id", "code"):
            values = [getattr(preset, attribute) for preset in self.presets]
            if len(values) != len(set(values)):
                raise ValueError(f"preset {attribute}s must be unique")
        return self


@dataclass(frozen=True, slots=True)
class LoadReport:
    changed: bool
    version: int
    presets: int
    retired: int


def read_preset_file(path: Path = DEFAULT_PRESET_FILE) -> PresetFile:
    """Parse and validate ``path``; ``PresetFileError`` with the failing field otherwise."""
    try:
        return PresetFile.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        raise PresetFileError(f"{path.name}: {exc}") from exc


def _same(stored: PresetRow, entry: PresetEntry, profile: str) -> bool:
    """Whether loading ``entry`` under ``profile`` would store what is already stored."""
    return stored.embedding_profile == profile and all(
        getattr(stored, name) == value for name, value in dict(entry).items()
    )


async def load_presets(
    engine: AsyncEngine, embedder: EmbeddingProvider, preset_file: PresetFile, profile: str
) -> LoadReport:
    """Bring ``ai.keyword_preset`` in line with ``preset_file`` under ``profile``.

    Raises ``PresetFileError`` when an id's code differs from the stored one (codes are
    immutable), ``ConfigurationError`` when the embedder's vectors (``embedder.dimension``,
    padded) do not fit the vector columns, and provider errors from the embedding call (made
    outside any transaction).
    """
    await check_vector_columns(engine, embedder.dimension)
    async with transaction(engine) as conn:
        stored = {row.id: row for row in await keyword_preset.load_all(conn)}
    for entry in preset_file.presets:
        if entry.id in stored and stored[entry.id].code != entry.code:
            raise PresetFileError(
                f"preset {entry.id}: code is immutable, stored {stored[entry.id].code!r}"
            )
    listed = {entry.id for entry in preset_file.presets}
    to_retire = [row for row in stored.values() if row.is_active and row.id not in listed]
    unchanged = not to_retire and all(
        entry.id in stored and _same(stored[entry.id], entry, profile)
        for entry in preset_file.presets
    )
    current_version = max((row.version for row in stored.values()), default=0)
    if unchanged:
        return LoadReport(False, current_version, len(preset_file.presets), 0)

    vectors = await embedder.embed([entry.embedding_input() for entry in preset_file.presets])
    version = current_version + 1
    rows = [
        _row(entry, vector, profile, version)
        for entry, vector in zip(preset_file.presets, vectors, strict=True)
    ]
    async with transaction(engine) as conn:
        await keyword_preset.upsert_all(conn, rows)
        retired = await keyword_preset.retire_missing(
            conn, kept_ids=sorted(listed), version=version
        )
    logger.info("presets loaded: %d presets, version %d, %d retired", len(rows), version, retired)
    return LoadReport(True, version, len(rows), retired)


def _row(entry: PresetEntry, vector: np.ndarray, profile: str, version: int) -> PresetRow:
    """The stored form of ``entry``: its fields plus what the load supplies."""
    return PresetRow(**dict(entry), embedding=vector, embedding_profile=profile, version=version)
