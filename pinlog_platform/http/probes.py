"""``GET /healthz`` and ``GET /metrics``, the same on both services (§8).

Liveness says only that the process answers; readiness is each service's own (what it needs
differs), so it is not here. ``/metrics`` serves the Prometheus registry of the app that mounts
the router, found as ``request.app.state.metrics_registry``.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

probes = APIRouter()


@probes.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: the process answers. Always HTTP 200 ``{"status": "ok"}``."""
    return {"status": "ok"}


@probes.get("/metrics")
async def prometheus_metrics(request: Request) -> Response:
    """Prometheus text format of this app's own registry (``app.state.metrics_registry``)."""
    return Response(
        generate_latest(request.app.state.metrics_registry), media_type=CONTENT_TYPE_LATEST
    )
