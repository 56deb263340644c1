"""Readiness facts for operators (§8): database reachable, preset cache loaded, and each
provider's availability as its gate sees it (reported, not a readiness problem: the
status code keeps meaning "this process can serve").

``problems()`` answers within ``timeout_seconds`` (0.8 s) in every state, below the 1 s that
probes allow: the database check runs on a connection of its own (the worker pool may be
exhausted or waiting on locks), at most one check runs at a time and concurrent probes share
it, and a result younger than ``cache_seconds`` is reused. A check still running when the
wait ends reports the database as not answering; it goes on and its result serves the next
probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping

from sqlalchemy.ext.asyncio import AsyncEngine

from app.failure_policy import PROVIDER_WIDE_REASONS
from app.metrics import WorkerMetrics
from app.repository.db import ping
from app.service.presets import PresetCache
from app.service.provider_gate import RATE_LIMITED_REASON, ProviderGate
from app.service.spend_guard import REASON as SPEND_CAP_REASON

DATABASE_UNAVAILABLE = "database unavailable"
DATABASE_SLOW = "database not answering within the readiness timeout"
# Every reason a gate can give (``ProviderGate.reason``): the label values of
# ``pinlog_provider_unavailable``, each exported from startup.
GATE_REASONS = PROVIDER_WIDE_REASONS | {RATE_LIMITED_REASON, SPEND_CAP_REASON}


class Readiness:
    """``/readyz``'s facts; ``probe_engine`` must be an engine of its own (one connection),
    times are seconds (module docstring)."""

    def __init__(
        self,
        probe_engine: AsyncEngine,
        presets: PresetCache,
        gates: Mapping[str, ProviderGate],
        *,
        profile: str,
        timeout_seconds: float = 0.8,
        cache_seconds: float = 1.0,
        offline: bool = False,
        max_request_bytes: int | None = None,
        batch: bool = False,
        keyword_batch: bool = False,
    ) -> None:
        self._engine = probe_engine
        # Whether this worker's embedding provider takes the Batch API (`reembed start --via
        # batch` is refused while a worker of the profile reports false).
        self.batch = batch
        # Whether its judge provider takes the Batch API (`reprocess keywords --via batch`).
        self.keyword_batch = keyword_batch
        # The largest request body this worker takes (PINLOG_MAX_REQUEST_BYTES), reported by
        # /readyz so the core cuts its backfill batches to fit.
        self.max_request_bytes = max_request_bytes
        self.mode = "offline" if offline else "online"  # reported by /readyz (PINLOG_OFFLINE)
        self.profile = profile
        self._presets = presets
        self._gates = gates
        self._timeout_seconds = timeout_seconds
        self._cache_seconds = cache_seconds
        self._check: asyncio.Task[bool] | None = None
        self._checked_at = -float("inf")

    async def problems(self) -> list[str]:
        """Empty when ready; otherwise short fixed strings naming each failing part."""
        problems: list[str] = []
        database = await self._database()
        if database is not None:
            problems.append(database)
        if not self._presets.loaded:
            problems.append("presets not loaded")
        return problems

    def preset_version(self) -> int | None:
        """The loaded preset revision (``keyword_preset.version``), ``None`` before loading."""
        return self._presets.snapshot().version if self._presets.loaded else None

    def providers(self) -> dict[str, dict[str, object]]:
        """``{"embedding": {...}, "judge": {...}}``, each ``{"available": bool,
        "retryAfterSeconds": int | None, "reason": str | None}`` (the pinned ``/readyz``
        shape)."""
        return {
            name: {
                "available": gate.available,
                "retryAfterSeconds": gate.retry_after_seconds(),
                "reason": gate.reason,
            }
            for name, gate in self._gates.items()
        }

    async def export_gauges(self, metrics: WorkerMetrics) -> None:
        """Set the gauges read when ``/metrics`` is scraped: ``pinlog_database_up`` (the
        database check above, shared and cached for ``cache_seconds``) and
        ``pinlog_provider_unavailable{provider,reason}`` (1 for each gate's reason now)."""
        metrics.database_up.set(0 if await self._database() else 1)
        for name, gate in self._gates.items():
            reason = gate.reason
            for known in GATE_REASONS | ({reason} if reason else set()):
                metrics.provider_unavailable.labels(name, known).set(1 if known == reason else 0)

    async def _database(self) -> str | None:
        fresh = time.monotonic() - self._checked_at < self._cache_seconds
        if self._check is None or (self._check.done() and not fresh):
            self._check = asyncio.create_task(self._ping())
        try:
            # shield: a probe that gives up must not cancel the check the others share.
            answered = await asyncio.wait_for(asyncio.shield(self._check), self._timeout_seconds)
        except TimeoutError:
            return DATABASE_SLOW
        return None if answered else DATABASE_UNAVAILABLE

    async def _ping(self) -> bool:
        try:
            # Bounded on its own too, so a hung connect never blocks every later check.
            async with asyncio.timeout(max(self._timeout_seconds, self._cache_seconds) * 5):
                return await ping(self._engine)
        except TimeoutError:
            return False
        finally:
            self._checked_at = time.monotonic()

    async def aclose(self) -> None:
        """Stop a check still running (shutdown)."""
        if self._check is not None and not self._check.done():
            self._check.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._check
