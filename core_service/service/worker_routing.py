"""Which embedding profile each worker instance serves, kept current for routing
(docs/operations.md "Switching the embedding profile").

During a switch, workers of two profiles run side by side behind
``PINLOG_CORE_WORKER_BASE_URL``. Every ``REFRESH_SECONDS`` this loop reads each instance's
``/readyz`` body (``profile``, pinned) and stores it on its ``WorkerEndpoint``, with the
largest request body it takes (``maxRequestBytes``: backfill batches are cut to fit it); dispatches,
searches and backfill batches then go to instances of the profile they need
(``WorkerEndpoints.in_turn(profile)``). An instance that cannot be read keeps the profile last
seen (a restart does not change a worker's profile). Nothing is written or logged but changes.
With ``metrics``, each read also sets ``pinlog_core_workers_ready{profile}`` (the instances
that said ready, by the profile each serves; instances whose profile was never seen are not
counted) and ``pinlog_core_profile_in_use{profile}`` (1 for the profile in use), which the
alert "no ready worker for the profile in use" compares (deploy/prometheus/).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Sequence

from core_service.metrics import CoreMetrics
from core_service.service.profile_in_use import ProfileInUse
from core_service.service.worker_endpoints import WorkerEndpoint, WorkerEndpoints
from core_service.service.worker_readiness import ReadinessReader, WorkerReadiness, display_url

logger = logging.getLogger(__name__)

# How often the instances' profiles are read (seconds).
REFRESH_SECONDS = 5.0


class ProfileRouting:
    """Keeps ``endpoints``' ``profile`` current; ``refresh_once`` or ``run_forever``;
    ``aclose`` when only ``refresh_once`` was used."""

    def __init__(
        self,
        endpoints: WorkerEndpoints,
        *,
        metrics: CoreMetrics | None = None,
        profile_in_use: ProfileInUse | None = None,
    ) -> None:
        self._endpoints = endpoints
        self._reader = ReadinessReader([e.base_url for e in endpoints.all])
        self._metrics = metrics
        self._profile_in_use = profile_in_use

    async def refresh_once(self) -> None:
        """Read every instance's profile once (the instances listed now: a DNS name's change
        with ``worker_discovery``); never raises for worker faults."""
        endpoints = list(self._endpoints.all)
        readings = await read_profiles(self._reader, endpoints)
        if self._metrics is None:
            return
        ready: collections.Counter[str] = collections.Counter()
        for endpoint, reading in zip(endpoints, readings, strict=True):
            if endpoint.profile is not None:
                ready[endpoint.profile] += 1 if reading.ready else 0
        in_use = await self._profile_in_use.current() if self._profile_in_use else None
        # Cleared and set with no await between: a scrape sees the whole new set.
        self._metrics.workers_ready.clear()
        for profile in {*ready, *([in_use] if in_use else [])}:
            self._metrics.workers_ready.labels(profile).set(ready[profile])
        if in_use is not None:
            self._metrics.profile_in_use.clear()
            self._metrics.profile_in_use.labels(in_use).set(1)

    async def run_forever(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                try:
                    await self.refresh_once()
                except Exception:
                    logger.exception("worker profile refresh failed; continuing")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), REFRESH_SECONDS)
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Close the readiness reader's client (``run_forever`` does on its way out)."""
        await self._reader.aclose()


async def read_profiles(
    reader: ReadinessReader, endpoints: Sequence[WorkerEndpoint]
) -> list[WorkerReadiness]:
    """Read each of ``endpoints``' ``/readyz`` once and store its profile and body limit on
    it (an instance that cannot be read keeps what was last seen); the readings, in
    ``endpoints``' order; never raises for worker faults."""
    readings = await reader.read_all(
        [e.base_url for e in endpoints], [e.host_header for e in endpoints]
    )
    for endpoint, reading in zip(endpoints, readings, strict=True):
        if reading.profile is not None and reading.profile != endpoint.profile:
            logger.info("worker %s serves profile %s", display_url(endpoint.base_url),
                        reading.profile)  # fmt: skip
            endpoint.profile = reading.profile
        if reading.max_request_bytes is not None:
            endpoint.max_request_bytes = reading.max_request_bytes
        if reading.profile is not None:  # read: what it says of batches stands
            endpoint.takes_batches = reading.batch
            endpoint.judge_takes_batches = reading.keyword_batch
    return readings
