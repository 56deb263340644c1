"""The embedding profile in use, as this core process sees it (docs/contract.md §5,
Deviation "profile in use"; docs/operations.md "Switching the embedding profile").

The value is ``core.embedding_switch.profile_in_use`` (0061), written by ``pinlog-core reembed
cutover`` and ``rollback``; before any switch (no row) it is ``PINLOG_CORE_EMBEDDING_PROFILE``.
Every process reads it at most ``CACHE_SECONDS`` old. **Inside that window** after a cutover or
rollback a process still uses the previous profile: its searches are answered by the previous
profile's workers from that profile's vectors, which the switch keeps complete until
``reembed finish`` (so they are still right; finish starts only once the window has passed
since the last change), and its dispatches go to the previous profile's workers, whose
judgments the cutover's re-judging pass (which starts only after ``PROPAGATION_SECONDS``)
sends back again and whose vectors the backfill loop gives the profile in use (after a
rollback the switch stays ``rolling_back`` until it has). A database fault keeps the last
value (logged).
"""

from __future__ import annotations

import asyncio
import logging
import time

from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.errors import CoreError
from core_service.repository import embedding_switch
from core_service.repository.db import autocommit

logger = logging.getLogger(__name__)

# A core process acts on a profile in use at most this old (seconds).
CACHE_SECONDS = 5.0
# What a command that changed the profile waits before acting on the change everywhere.
PROPAGATION_SECONDS = CACHE_SECONDS + 1.0


class ProfileInUse:
    """The profile in use, cached (module docstring); ``configured`` before any switch."""

    def __init__(self, engine: AsyncEngine, *, configured: str) -> None:
        self._engine = engine
        self._value = configured
        self._configured = configured
        self._read_at = -CACHE_SECONDS
        self._lock = asyncio.Lock()

    async def current(self) -> str:
        """The profile in use, at most ``CACHE_SECONDS`` old; never raises."""
        if time.monotonic() - self._read_at < CACHE_SECONDS:
            return self._value
        async with self._lock:
            started = time.monotonic()
            if started - self._read_at < CACHE_SECONDS:
                return self._value
            try:
                async with autocommit(self._engine) as conn:
                    row = await embedding_switch.read(conn)
            except CoreError as exc:
                self._read_at = time.monotonic()
                logger.warning("profile in use not read (%s); keeping %s",
                               type(exc).__name__, self._value)  # fmt: skip
                return self._value
            value = self._configured if row is None else row.profile_in_use
            if value != self._value:
                logger.warning("embedding profile in use: %s (was %s)", value, self._value)
            self._value, self._read_at = value, started
            return value


async def read_profile_in_use(engine: AsyncEngine, *, configured: str) -> str:
    """The profile in use now (no cache): the switch row's, else ``configured``; what an
    operator command acts on."""
    async with autocommit(engine) as conn:
        row = await embedding_switch.read(conn)
    return configured if row is None else row.profile_in_use
