"""The shared-secret check for ``/internal/*`` (§8), as pure ASGI middleware.

Runs before routing and body parsing, so an unauthenticated caller learns nothing (not even
whether its body was valid): always 401. Compared in constant time.
"""

from __future__ import annotations

import hmac

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

HEADER = b"x-internal-secret"
# Rendered as every other error answer (no spaces: Starlette's JSONResponse, orjson).
_BODY = orjson.dumps({"detail": "missing or wrong X-Internal-Secret"})


class InternalSecretMiddleware:
    def __init__(self, app: ASGIApp, *, secret: str) -> None:
        self._app = app
        self._secret = secret.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/internal/"):
            given = dict(scope["headers"]).get(HEADER, b"")
            if not hmac.compare_digest(given, self._secret):
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(_BODY)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": _BODY})
                return
        await self._app(scope, receive, send)
