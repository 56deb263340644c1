"""The preset cache and its immutable snapshots; candidate selection by cosine (§4, FC-04).

A request takes one snapshot and uses it from candidate search to save, so ``preset_version``
never mixes within a judgment. The cache is loaded at startup (none usable: startup fails) and
refreshed in the background every ``PINLOG_PRESETS_REFRESH_SECONDS`` (§4 Deviation: a new list
is picked up without a restart): a refresh builds a new snapshot off the request path and
swaps it in with one assignment; a request that already holds the previous one finishes with
it. A refresh that fails (database, or no usable preset left for the profile) keeps the last
snapshot and logs one WARNING.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
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
    """Usable presets of one profile; ``version`` is the list version they were loaded as
    (``pinlog_platform.contract.preset_list``, 0 for none); ``unit_vectors`` is float64
    ``(n_presets, dimension)``."""

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


def build_snapshot(profile: str, rows: Sequence[PresetRow]) -> PresetSnapshot:
    """Snapshot of ``rows`` (the presets usable under ``profile``); presets whose vector has
    zero or non-finite norm are rejected. The version is the highest among all of ``rows``,
    rejected ones included: the list version as ``pinlog_platform.contract.preset_list`` defines
    it."""
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
    version = max((row.version for row in rows), default=0)
    matrix = np.vstack(vectors) if vectors else np.zeros((0, 0), np.float64)
    return PresetSnapshot(profile, version, tuple(usable), matrix)


class PresetCache:
    """Holds the current snapshot; loaded at startup, replaced atomically by ``reload``, and
    by ``refresh_once`` every ``refresh_seconds`` once ``start_refreshing`` runs."""

    def __init__(self, engine: AsyncEngine, profile: str, *, refresh_seconds: float = 30.0) -> None:
        self._engine = engine
        self._profile = profile
        self._refresh_seconds = refresh_seconds
        self._snapshot: PresetSnapshot | None = None
        self._refresher: asyncio.Task[None] | None = None

    async def reload(self) -> PresetSnapshot:
        """Load the presets usable under the current profile and make them the snapshot.

        Raises ``ConfigurationError`` when none are usable (startup must fail, §4), keeping the
        snapshot held before.
        """
        async with autocommit(self._engine) as conn:
            rows = await keyword_preset.load_usable(conn, self._profile)
        snapshot = build_snapshot(self._profile, rows)
        if not snapshot.presets:
            raise ConfigurationError(
                f"no usable keyword presets for embedding profile {self._profile!r}; "
                "run `pinlog-ai presets load`"
            )
        previous, self._snapshot = self._snapshot, snapshot
        if previous is None or _changed(previous, snapshot):
            logger.info(
                "preset cache loaded: %d presets, version %d",
                len(snapshot.presets),
                snapshot.version,
            )
        return snapshot

    async def refresh_once(self) -> bool:
        """One background refresh: ``True`` when a snapshot was loaded; ``False`` (one
        WARNING, the last snapshot kept) when the database failed or no preset was usable."""
        try:
            await self.reload()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # The class names the cause; the message of a ConfigurationError is ours.
            detail = str(exc) if isinstance(exc, ConfigurationError) else type(exc).__name__
            logger.warning(
                "preset refresh failed, keeping list version %s: %s",
                self._snapshot.version if self._snapshot is not None else "none",
                detail,
            )
            return False
        return True

    def start_refreshing(self) -> None:
        """Refresh every ``refresh_seconds`` in a task of its own until ``aclose``."""
        if self._refresher is None:
            self._refresher = asyncio.create_task(self._refresh_forever())

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_seconds)
            await self.refresh_once()

    async def aclose(self) -> None:
        """Stop the background refresh (shutdown)."""
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
            self._refresher = None

    @property
    def loaded(self) -> bool:
        return self._snapshot is not None

    def snapshot(self) -> PresetSnapshot:
        """The current snapshot; ``RuntimeError`` before the first ``reload``."""
        if self._snapshot is None:
            raise RuntimeError("preset cache used before it was loaded")
        return self._snapshot


def _changed(previous: PresetSnapshot, current: PresetSnapshot) -> bool:
    """Whether a refresh loaded another list (version or presets), worth an INFO line."""
    return previous.version != current.version or [p.id for p in previous.presets] != [
        p.id for p in current.presets
    ]
