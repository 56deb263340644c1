"""The preset cache and its immutable snapshots; candidate selection by cosine (§4, FC-04).

A request takes one snapshot and uses it from candidate search to save, so ``preset_version``
never mixes within a judgment.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields

import numpy as np
from sqlalchemy.ext.asyncio import AsyncEngine

from app.errors import ConfigurationError
from app.providers.base import JudgeCandidate
from app.repository import keyword_preset
from app.repository.db import autocommit
from app.repository.keyword_preset import PresetRow

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PresetSnapshot:
    """Usable presets of one profile; ``unit_vectors`` is float64 ``(n_presets, dimension)``."""

    profile: str
    version: int
    presets: tuple[PresetRow, ...]
    unit_vectors: np.ndarray

    def candidates(self, vector: np.ndarray, *, top_k: int, floor: float) -> list[JudgeCandidate]:
        """Top ``top_k`` presets by cosine with ``vector`` (shape ``(dimension,)``), each with
        similarity >= ``floor``, best first. A non-finite similarity is never a candidate.
        """
        # float64 so a vector at a huge or tiny scale keeps its direction (FC-04).
        query = np.asarray(vector, dtype=np.float64)
        norm = float(np.linalg.norm(query))
        if not np.isfinite(norm) or norm == 0.0 or not self.presets:
            return []
        similarities = self.unit_vectors @ (query / norm)
        eligible = np.flatnonzero(np.isfinite(similarities) & (similarities >= floor))
        ranked = eligible[np.argsort(-similarities[eligible], kind="stable")][:top_k]
        return [_candidate(self.presets[i], float(similarities[i])) for i in ranked]


# What the judge sees of a preset: every field of JudgeCandidate but the similarity.
_CANDIDATE_FIELDS = tuple(
    field.name for field in fields(JudgeCandidate) if field.name != "similarity"
)


def _candidate(preset: PresetRow, similarity: float) -> JudgeCandidate:
    return JudgeCandidate(
        similarity=similarity, **{name: getattr(preset, name) for name in _CANDIDATE_FIELDS}
    )


def build_snapshot(profile: str, rows: list[PresetRow]) -> PresetSnapshot:
    """Snapshot of ``rows``; presets whose vector has zero or non-finite norm are rejected."""
    usable: list[PresetRow] = []
    vectors: list[np.ndarray] = []
    for row in rows:
        embedding = np.asarray(row.embedding, dtype=np.float64)
        norm = float(np.linalg.norm(embedding))
        if not np.isfinite(norm) or norm == 0.0:
            logger.error(
                "preset rejected: zero or non-finite embedding norm (preset_id=%d)", row.id
            )
            continue
        usable.append(row)
        vectors.append(embedding / norm)
    version = max((row.version for row in usable), default=0)
    matrix = np.vstack(vectors) if vectors else np.zeros((0, 0), np.float64)
    return PresetSnapshot(profile, version, tuple(usable), matrix)


class PresetCache:
    """Holds the current snapshot; loaded at startup, replaced atomically by ``reload``."""

    def __init__(self, engine: AsyncEngine, profile: str) -> None:
        self._engine = engine
        self._profile = profile
        self._snapshot: PresetSnapshot | None = None

    async def reload(self) -> PresetSnapshot:
        """Load usable presets of the current profile.

        Raises ``ConfigurationError`` when none are usable (startup must fail, §4).
        """
        async with autocommit(self._engine) as conn:
            rows = await keyword_preset.load_usable(conn, self._profile)
        snapshot = build_snapshot(self._profile, rows)
        if not snapshot.presets:
            raise ConfigurationError(
                f"no usable keyword presets for embedding profile {self._profile!r}; "
                "run `pinlog-ai presets load`"
            )
        self._snapshot = snapshot
        logger.info(
            "preset cache loaded: %d presets, version %d", len(snapshot.presets), snapshot.version
        )
        return snapshot

    @property
    def loaded(self) -> bool:
        return self._snapshot is not None

    def snapshot(self) -> PresetSnapshot:
        """The current snapshot; ``RuntimeError`` before the first ``reload``."""
        if self._snapshot is None:
            raise RuntimeError("preset cache used before it was loaded")
        return self._snapshot
