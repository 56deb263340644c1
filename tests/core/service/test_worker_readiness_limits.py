"""The core believes a worker's reported body limit (``maxRequestBytes`` of its ``/readyz``)
only within what a worker may be configured to (``pinlog_platform.contract.request_limits``):
a value outside would cut every backfill batch to nothing and fail notes ``input_too_long``
for a fault that is not theirs. Real HTTP: a server answering ``/readyz`` as a worker would."""

from __future__ import annotations

import pytest
from fastapi import FastAPI

from core_service.service.worker_readiness import ReadinessReader
from pinlog_platform.contract.request_limits import MAX_REQUEST_BYTES, MIN_REQUEST_BYTES
from tests.worker.harness import PROFILE, serving


def _worker_reporting(limit: object) -> FastAPI:
    app = FastAPI()

    @app.get("/readyz")
    async def readyz() -> dict:
        return {
            "status": "ready",
            "mode": "online",
            "profile": PROFILE,
            "presetVersion": 1,
            "maxRequestBytes": limit,
        }

    return app


@pytest.mark.parametrize(
    ("reported", "believed"),
    [
        pytest.param(65536, 65536, id="the-default"),
        pytest.param(MIN_REQUEST_BYTES, MIN_REQUEST_BYTES, id="the-smallest-a-worker-takes"),
        pytest.param(MAX_REQUEST_BYTES, MAX_REQUEST_BYTES, id="the-largest-a-worker-takes"),
        pytest.param(10, None, id="below-any-worker"),
        pytest.param(MAX_REQUEST_BYTES + 1, None, id="above-any-worker"),
        pytest.param(2**63, None, id="huge"),
        pytest.param(0, None, id="zero"),
        pytest.param(True, None, id="a-boolean"),
        pytest.param("65536", None, id="a-string"),
    ],
)
async def test_a_reported_limit_is_believed_only_within_what_a_worker_may_be_set_to(
    reported: object, believed: int | None
):
    async with serving(_worker_reporting(reported)) as base_url:
        reader = ReadinessReader([base_url])
        try:
            (readiness,) = await reader.read_all()
        finally:
            await reader.aclose()
    assert readiness.ready and readiness.profile == PROFILE
    assert readiness.max_request_bytes == believed
