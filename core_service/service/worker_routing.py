"""Which embedding profile each worker instance serves, kept current for routing
(docs/operations.md "Switching the embedding profile").

During a switch, workers of two profiles run side by side behind
``PINLOG_CORE_WORKER_BASE_URL``. Every ``REFRESH_SECONDS`` this loop reads each instance's
``/readyz`` body (``profile``, pinned) and stores it on its ``WorkerEndpoint``, with the
largest request body it takes (``maxRequestBytes``: backfill batches are cut to fit it); dispatches,
searches and backfill batches then go to instances of the profile they need
(``WorkerEndpoints.in_turn(profile)``). An instance that cannot be read keeps the profile last
seen (a restart does not change a worker's profile). Nothing is written or logged but changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from core_service.service.worker_endpoints import WorkerEndpoint, WorkerEndpoints
from core_service.service.worker_readiness import ReadinessReader, display_url

logger = logging.getLogger(__name__)

# How often the instances' profiles are read (seconds).
REFRESH_SECONDS = 5.0


class ProfileRouting:
    """Keeps ``endpoints``' ``profile`` current; ``refresh_once`` or ``run_forever``;
    ``aclose`` when only ``refresh_once`` was used."""

    def __init__(self, endpoints: WorkerEndpoints) -> None:
        self._endpoints = endpoints
        self._reader = ReadinessReader([e.base_url for e in endpoints.all])

    async def refresh_once(self) -> None:
        """Read every instance's profile once (the instances listed now: a DNS name's change
        with ``worker_discovery``); never raises for worker faults."""
        await read_profiles(self._reader, self._endpoints.all)

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


async def read_profiles(reader: ReadinessReader, endpoints: Sequence[WorkerEndpoint]) -> None:
    """Read each of ``endpoints``' ``/readyz`` once and store its profile and body limit on
    it (an instance that cannot be read keeps what was last seen); never raises for worker
    faults."""
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
