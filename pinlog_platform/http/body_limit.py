"""A request body cap enforced while the body arrives, as pure ASGI middleware; used by both
services (the worker's ``MAX_REQUEST_BYTES``, §8, and the core's ``MAX_REQUEST_BYTES``).

A declared ``Content-Length`` above ``max_bytes`` (or not a number) is answered ``413`` before a
byte of the body is read; a body without one (chunked) is counted as it is received and cut off
with ``413`` as soon as it passes the cap (an ``HTTPException``, which FastAPI re-raises from
body reading instead of turning it into a 400). So no request makes a service hold more than
``max_bytes`` of body. Ours rather than ``FastAPI(max_body_size=...)``: that one runs outside
every user middleware, so it would answer an unauthenticated caller of the worker before the
secret check. It imports neither service: ``app`` and ``core_service`` never import each other.
"""

from __future__ import annotations

import orjson
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

DETAIL = "request body too large"
# The bytes the streamed case answers too (HTTPException rendered by OrjsonResponse in the
# core; Starlette's JSONResponse in the worker, the same bytes): one condition, one answer.
_BODY = orjson.dumps({"detail": DETAIL})


class BodySizeLimitMiddleware:
    """413 for a body over ``max_bytes`` (bytes), decided before or while it is read."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self._app = app
        self._max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self._max_bytes):
            await _refuse(send)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self._max_bytes:
                    raise HTTPException(status_code=413, detail=DETAIL)
            return message

        await self._app(scope, limited_receive, send)


async def _refuse(send: Send) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(_BODY)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": _BODY})
