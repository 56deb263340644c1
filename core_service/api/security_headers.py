"""Response headers for private data, as a pure ASGI middleware.

Every answer gets ``X-Content-Type-Options: nosniff`` (a JSON body is never sniffed into
HTML); every answer under one of ``private_prefixes`` (the authenticated API: 401s and errors
included) gets ``Cache-Control: no-store``, so no shared or browser cache keeps a member's
notes. Headers the app set itself are kept.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.types import ASGIApp, Message, Receive, Scope, Send

NOSNIFF = (b"x-content-type-options", b"nosniff")
NO_STORE = (b"cache-control", b"no-store")


class SecurityHeadersMiddleware:
    def __init__(self, app: ASGIApp, *, private_prefixes: Sequence[str]) -> None:
        self.app = app
        self._private_prefixes = tuple(private_prefixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        private = str(scope.get("path", "")).startswith(self._private_prefixes)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                if NOSNIFF[0] not in present:
                    headers.append(NOSNIFF)
                if private and NO_STORE[0] not in present:
                    headers.append(NO_STORE)
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)
