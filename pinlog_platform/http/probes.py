"""``GET /healthz`` (``liveness``) and ``GET /metrics`` (``metrics``), the same on both
services (§8). ``probes`` has both: the worker serves it (its whole API is internal); the core
serves ``liveness`` on its public port and ``metrics`` on its operations listener only
(``core_service/operations_listener.py``).

Readiness is each service's own (what it needs differs), so it is not here. ``/metrics``
serves the Prometheus registry of the app that mounts the router, found as
``request.app.state.metrics_registry``, after awaiting ``request.app.state.before_scrape()``
when the app set one (gauges read at scrape time, e.g. whether the database answers).
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

liveness = APIRouter()
metrics = APIRouter()


@liveness.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: the process answers. Always HTTP 200 ``{"status": "ok"}``."""
    return {"status": "ok"}


@metrics.get("/metrics")
async def prometheus_metrics(request: Request) -> Response:
    """Prometheus text format of this app's own registry (``app.state.metrics_registry``),
    after ``app.state.before_scrape()`` (when set; it bounds its own wait)."""
    before_scrape = getattr(request.app.state, "before_scrape", None)
    if before_scrape is not None:
        await before_scrape()
    return Response(
        generate_latest(request.app.state.metrics_registry), media_type=CONTENT_TYPE_LATEST
    )


# Both, on one listener: the worker, whose whole API is internal (§8).
probes = APIRouter()
probes.include_router(liveness)
probes.include_router(metrics)
