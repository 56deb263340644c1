"""HTTP request latency by route template, method and status class, as pure ASGI middleware.

Used by both services. Pure ASGI rather than ``BaseHTTPMiddleware``: no extra task and no
response re-streaming per request on the accept path, only a wrapped ``send``. Labels come from
fixed sets, so a caller choosing paths or methods creates no series: the route template that
matched (never the raw path), ``unmatched`` when routing did not run or found nothing (including
requests the secret check refused, 401, or a declared body over the cap, 413), a known method or
``other``, and the status class (``2xx`` .. ``5xx``; ``5xx`` when the app raised before
answering).
"""

from __future__ import annotations

import time

from prometheus_client import Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# The label values of method and route outside the known sets.
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
UNMATCHED_ROUTE = "unmatched"
OTHER_METHOD = "other"


class RequestTimingMiddleware:
    """Observes each HTTP request's duration in seconds into ``histogram``, a Prometheus
    histogram labelled ``(route, method, status)`` in that order."""

    def __init__(self, app: ASGIApp, *, histogram: Histogram) -> None:
        self._app = app
        self._histogram = histogram
        # Children by label tuple: the tuples come from fixed sets, so this stays small, and a
        # dict lookup is cheaper than ``labels()`` per request.
        self._children: dict[tuple[str, str, str], Histogram] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_noting_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self._app(scope, receive, send_noting_status)
        finally:
            # The router stores the matched route in this same scope dict.
            route = scope.get("route")
            method = scope["method"]
            key = (
                getattr(route, "path", UNMATCHED_ROUTE),
                method if method in HTTP_METHODS else OTHER_METHOD,
                f"{status // 100}xx",
            )
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = self._histogram.labels(*key)
            child.observe(time.perf_counter() - started)
