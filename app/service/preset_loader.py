"""``pinlog-ai presets load``: embed the preset file with the current profile and store it (§4;
per-profile vectors: §1 Deviation in docs/contract.md).

The preset file is validated strictly (``PresetFileError`` names the field). The shared preset
rows (id, code, names, examples, visibility, active, version) are the same for every profile;
each profile has its own vectors of them. A load under profile P:

- writes nothing when the shared rows equal the file and P's vectors are current (embedded
  from each preset's current revision);
- when the file changed (content, or presets missing from it): embeds every preset in one
  provider call, writes the shared rows with list version ``max(stored) + 1``, retires active
  presets missing from the file (``is_active = false``, never deleted) and writes P's vectors;
- when only P's vectors are missing or stale (the list was loaded under another profile):
  embeds and writes P's vectors, stamped with the presets' current revisions; the shared rows
  and the list version stay as they are.

Loads are serialised where they write: the writing transaction takes the list's lock
(``keyword_preset.lock_list``) and re-reads the shared rows; when another load changed them
after this one read them (while this one was in its provider call), nothing is written and
the load starts over from the new list, so a list version always names one list. After
``LOAD_ATTEMPTS`` such restarts ``PresetListChangedError``.

Another profile's vectors are never written. After a changing load under P they are stale
until that profile is loaded too: its workers keep their last list until then
(``pinlog_platform.contract.preset_list``).
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
from app.repository.keyword_preset import PresetDefinition, PresetRow
from app.service.vector_columns import check_vector_columns

logger = logging.getLogger(__name__)

DEFAULT_PRESET_FILE = Path(__file__).resolve().parents[1] / "presets" / "keyword_presets.yaml"
# The ledger's stage of the preset embeddings ``presets load`` pays for (ai.provider_usage_daily).
PRESETS_STAGE = "presets"


# Restarts of a load whose list another load changed meanwhile (module docstring).
LOAD_ATTEMPTS = 3


class PresetFileError(ValueError):
    """The preset file is not valid YAML of the documented shape."""


class PresetListChangedError(RuntimeError):
    """Other loads changed the preset list during each of ``LOAD_ATTEMPTS`` attempts."""


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
    """What a load wrote: ``changed`` anything at all; ``list_changed`` the shared rows (a new
    list ``version``), else only this profile's vectors (or nothing); ``presets`` in the file,
    ``retired`` by this load."""

    changed: bool
    version: int
    presets: int
    retired: int
    list_changed: bool = False


def read_preset_file(path: Path = DEFAULT_PRESET_FILE) -> PresetFile:
    """Parse and validate ``path``; ``PresetFileError`` with the failing field otherwise."""
    try:
        return PresetFile.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        raise PresetFileError(f"{path.name}: {exc}") from exc


def _same(stored: PresetDefinition, entry: PresetEntry) -> bool:
    """Whether ``entry``'s shared fields are what is already stored."""
    return all(getattr(stored, name) == value for name, value in dict(entry).items())


async def load_presets(
    engine: AsyncEngine, embedder: EmbeddingProvider, preset_file: PresetFile, profile: str
) -> LoadReport:
    """Bring the shared preset rows in line with ``preset_file`` and ``profile``'s vectors
    with them (module docstring).

    Raises ``PresetFileError`` when an id's code differs from the stored one (codes are
    immutable), ``ConfigurationError`` when the embedder's vectors (``embedder.dimension``,
    padded) do not fit the vector columns, provider errors from the embedding call (made
    outside any transaction), ``PresetListChangedError`` when concurrent loads kept changing
    the list (module docstring).
    """
    await check_vector_columns(engine, embedder.dimension)
    for _attempt in range(LOAD_ATTEMPTS):
        report = await _load_once(engine, embedder, preset_file, profile)
        if report is not None:
            return report
        logger.info("preset list changed by another load during this one; starting over")
    raise PresetListChangedError(
        f"the preset list was changed by other loads during {LOAD_ATTEMPTS} attempts; run again"
    )


async def _load_once(
    engine: AsyncEngine, embedder: EmbeddingProvider, preset_file: PresetFile, profile: str
) -> LoadReport | None:
    """One attempt of ``load_presets``; None when another load changed the shared rows after
    this one read them (nothing written)."""
    async with transaction(engine) as conn:
        read = await keyword_preset.load_definitions(conn)
        vectors = await keyword_preset.vector_versions(conn, profile)
    stored = {row.id: row for row in read}
    for entry in preset_file.presets:
        if entry.id in stored and stored[entry.id].code != entry.code:
            raise PresetFileError(
                f"preset {entry.id}: code is immutable, stored {stored[entry.id].code!r}"
            )
    listed = {entry.id for entry in preset_file.presets}
    to_retire = [row for row in stored.values() if row.is_active and row.id not in listed]
    list_unchanged = not to_retire and all(
        entry.id in stored and _same(stored[entry.id], entry) for entry in preset_file.presets
    )
    current_version = max((row.version for row in stored.values()), default=0)
    if list_unchanged:
        revisions = {entry.id: stored[entry.id].version for entry in preset_file.presets}
        if all(vectors.get(preset_id) == version for preset_id, version in revisions.items()):
            return LoadReport(False, current_version, len(preset_file.presets), 0)
    else:
        revisions = dict.fromkeys(listed, current_version + 1)

    vectors_of_file = await embedder.embed(
        [entry.embedding_input() for entry in preset_file.presets]
    )
    rows = [
        _row(entry, vector, profile, revisions[entry.id])
        for entry, vector in zip(preset_file.presets, vectors_of_file, strict=True)
    ]
    retired = 0
    async with transaction(engine) as conn:
        await keyword_preset.lock_list(conn)
        if await keyword_preset.load_definitions(conn) != read:
            return None
        if not list_unchanged:
            await keyword_preset.upsert_definitions(conn, rows)
            retired = await keyword_preset.retire_missing(
                conn, kept_ids=sorted(listed), version=current_version + 1
            )
        await keyword_preset.upsert_vectors(conn, rows)
    version = current_version if list_unchanged else current_version + 1
    logger.info(
        "presets loaded: %d presets, list version %d, %d retired, %s",
        len(rows),
        version,
        retired,
        "vectors of this profile only" if list_unchanged else "list changed",
    )
    return LoadReport(True, version, len(rows), retired, list_changed=not list_unchanged)


def _row(entry: PresetEntry, vector: np.ndarray, profile: str, version: int) -> PresetRow:
    """The stored form of ``entry``: its fields plus what the load supplies (``version``: the
    revision the vector is embedded from, which the shared row carries too)."""
    return PresetRow(**dict(entry), embedding=vector, embedding_profile=profile, version=version)
