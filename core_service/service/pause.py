"""Whether dispatching is paused for maintenance (docs/operations.md "Pause").

The state is one row of ``core.dispatch_control``, written by ``pinlog-core pause``/``resume``
(``core_service/operations/pause.py``). Every core process reads it through a ``PauseSwitch``,
at most ``CACHE_SECONDS`` old; the command returns once that bound (plus a margin for the read
itself) has passed, so when ``pinlog-core pause`` returns, no core process decides to send
anything any more (a request already on the wire finishes). While
paused: creates, edits and deletes commit ``PENDING`` rows as usual; the dispatcher sends
nothing (it holds what comes); the rescan claims nothing and spends nothing; the finalizer
fails nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.errors import CoreError, UnavailableError
from core_service.metrics import CoreMetrics
from core_service.repository import dispatch_control
from core_service.repository.db import autocommit

logger = logging.getLogger(__name__)

# A core process acts on a pause state at most this old (seconds).
CACHE_SECONDS = 1.0


class PauseSwitch:
    """Whether dispatching is paused, as this process sees it (module docstring)."""

    def __init__(self, engine: AsyncEngine, metrics: CoreMetrics | None = None) -> None:
        self._engine = engine
        self._metrics = metrics
        self._paused = False
        self._read_at = -CACHE_SECONDS  # monotonic start of the last read
        self._failed = False  # the last read met a database fault
        self._lock = asyncio.Lock()

    async def paused(self, *, strict: bool = False) -> bool:
        """The state at most ``CACHE_SECONDS`` old; one read at a time. A database fault keeps
        the last state for ``CACHE_SECONDS`` (logged), or raises ``UnavailableError`` when
        ``strict`` (a rescan pass cannot go on without it)."""
        if time.monotonic() - self._read_at < CACHE_SECONDS:
            return self._cached(strict)
        async with self._lock:
            started = time.monotonic()
            if started - self._read_at < CACHE_SECONDS:
                return self._cached(strict)
            try:
                async with autocommit(self._engine) as conn:
                    paused = await dispatch_control.read_paused(conn)
            except CoreError as exc:
                # A dead database is not asked again at once: callers waiting on this read
                # get its answer (the last state, or the fault when strict) for a second.
                self._read_at, self._failed = time.monotonic(), True
                if strict:
                    raise
                logger.warning("pause state not read (%s); keeping %s", type(exc).__name__,
                               "paused" if self._paused else "running")  # fmt: skip
                return self._paused
            if paused != self._paused:
                logger.warning("dispatch %s", "PAUSED" if paused else "resumed")
            self._paused, self._read_at, self._failed = paused, started, False
            if self._metrics is not None:
                self._metrics.paused.set(1 if paused else 0)
            return paused

    def _cached(self, strict: bool) -> bool:
        if strict and self._failed:
            raise UnavailableError("pause state unknown: database unavailable")
        return self._paused
