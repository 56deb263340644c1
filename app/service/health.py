"""Readiness facts for operators (§8): database reachable, preset cache loaded."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from app.repository.db import ping
from app.service.presets import PresetCache


class Readiness:
    """Readiness of one worker; ``offline`` (``PINLOG_OFFLINE``) is reported by ``/readyz``."""

    def __init__(self, engine: AsyncEngine, presets: PresetCache, *, offline: bool = False) -> None:
        self._engine = engine
        self._presets = presets
        self.mode = "offline" if offline else "online"

    async def problems(self) -> list[str]:
        """Empty when ready; otherwise short fixed strings naming each failing part."""
        problems: list[str] = []
        if not await ping(self._engine):
            problems.append("database unavailable")
        if not self._presets.loaded:
            problems.append("presets not loaded")
        return problems
