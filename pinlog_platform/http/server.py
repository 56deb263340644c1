"""How both services serve HTTP: uvicorn on httptools, with limits on what a client may hold.

An ASGI app is only called once a request head is parsed, so limits on the head live in the
protocol layer. uvicorn's own ``h11_max_incomplete_event_size`` does nothing on httptools
(chosen for speed), so ``LimitedHttpToolsProtocol`` adds, per connection:

- ``max_header_bytes``: a request head (request line and headers) larger than this answers
  431 and the connection closes, after reading at most one more socket read (64 KiB) past it:
  a client cannot make the process buffer a 64 MiB header;
- ``head_timeout``: a request head not complete this many seconds after the connection opened
  (or after the first byte of a later request on a keep-alive connection) answers 408 and the
  connection closes: a client trickling a request byte by byte holds a socket for at most this
  long.

The rest comes from uvicorn: ``limit_concurrency`` (beyond this many open connections or
running requests a request answers 503 at once, never a silent wait) and
``timeout_keep_alive``. The body and the handling of a request are bounded in ASGI
(``pinlog_platform.http.request_deadline``). docs/deployment.md ("Limits") lists the values and
what a reverse proxy in front should enforce.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from pinlog_platform.settings_rules.http_serving import HttpServingSettings


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a head size and a head deadline (module docstring);
    build a configured class with ``protocol_class``."""

    max_header_bytes: int = HttpServingSettings().max_header_bytes
    head_timeout: float = HttpServingSettings().head_timeout

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._in_head = True
        self._head_bytes = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._start_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        # Still inside a head after parsing what came: too large? (Body bytes that arrive in
        # the same read as the end of the head are not held against it.)
        if self._in_head and self._head_bytes > self.max_header_bytes:
            self._refuse(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if not self._in_head:  # the next request on a keep-alive connection
            self._in_head = True
            self._head_bytes = 0
            self._start_head_timer()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_head_timer()
        super().on_headers_complete()

    def _start_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.head_timeout, self._head_expired)

    def _cancel_head_timer(self) -> None:
        timer = getattr(self, "_head_timer", None)
        if timer is not None:
            timer.cancel()
            self._head_timer = None

    def _head_expired(self) -> None:
        self._head_timer = None
        if self._in_head:
            self._refuse(b"HTTP/1.1 408 Request Timeout\r\n")

    def _refuse(self, status_line: bytes) -> None:
        self._in_head = False
        self._cancel_head_timer()
        if self.transport.is_closing():
            return
        self.transport.write(status_line + b"content-length: 0\r\nconnection: close\r\n\r\n")
        self.transport.close()


def protocol_class(*, max_header_bytes: int, head_timeout: float) -> type[HttpToolsProtocol]:
    """A ``LimitedHttpToolsProtocol`` subclass with these limits (uvicorn's ``http=``)."""
    return type(
        "LimitedHttpToolsProtocol",
        (LimitedHttpToolsProtocol,),
        {"max_header_bytes": max_header_bytes, "head_timeout": head_timeout},
    )


def uvicorn_options(
    limits: HttpServingSettings,
    *,
    limit_concurrency: int | None = None,
    max_header_bytes: int | None = None,
    head_timeout: float | None = None,
    timeout_keep_alive: int | None = None,
) -> dict[str, Any]:
    """Keyword arguments of ``uvicorn.run`` / ``uvicorn.Config`` for a service's limits: each
    given keyword (a ``serve`` option) wins over the setting of the same name in ``limits``."""
    head_bytes = max_header_bytes or limits.max_header_bytes
    head_seconds = head_timeout or limits.head_timeout
    return {
        "http": protocol_class(max_header_bytes=head_bytes, head_timeout=head_seconds),
        "limit_concurrency": limit_concurrency or limits.limit_concurrency,
        "timeout_keep_alive": timeout_keep_alive or limits.timeout_keep_alive,
    }
