"""One overall deadline per HTTP request, the same on both services (§6).

The database's command deadline, the pool and connect timeouts and the provider's timeout each
bound one wait; this bounds the whole request, whatever it waits on. A request still running
at its deadline is cancelled and answers 503 with ``Retry-After`` (logged, and counted by the
``on_expiry`` callback), unless:

- its response has started (the status is on the wire; the rest follows or the connection
  ends), or
- it has begun to commit (``pinlog_platform.db.commit_watch.committing()``, entered by the
  database helpers right before ``COMMIT``): a create that committed must answer, or the
  client's retry would create a second context. The commit itself is bounded by the command
  deadline; a commit whose outcome is unknown answers 503 through the service's own error
  table.

Pure ASGI, in the request's own task: a timer cancels the app at the deadline (no task or
wait per request on the accept path), the cancellation unwinds the app's cleanup (each step of
it bounded by its own deadline), then the 503 is sent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from pinlog_platform.db.commit_watch import CommitWatch, watching

logger = logging.getLogger(__name__)

# Rendered like every other error answer (OrjsonResponse: no spaces).
EXPIRED_BODY = orjson.dumps({"detail": "request deadline exceeded"})


class RequestDeadlineMiddleware:
    """Answers 503 when an HTTP request runs longer than ``seconds`` (module docstring).
    ``retry_after`` is the ``Retry-After`` value; ``on_expiry`` is called once per expired
    request, ``on_commit_unknown`` once per commit of a request whose outcome is unknown
    (metrics)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        seconds: float,
        retry_after: str = "5",
        on_expiry: Callable[[], None] | None = None,
        on_commit_unknown: Callable[[], None] | None = None,
    ) -> None:
        self._app = app
        self._seconds = seconds
        self._retry_after = retry_after.encode()
        self._on_expiry = on_expiry
        self._on_commit_unknown = on_commit_unknown

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        state = CommitWatch(self._on_commit_unknown)
        task = asyncio.current_task()
        started = False
        expired = False

        async def send_noting_start(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        def expire() -> None:
            nonlocal expired
            if started or state.committing or task is None:
                return  # the answer is on its way, or a commit must not be cut
            expired = True
            task.cancel()

        timer = asyncio.get_running_loop().call_later(self._seconds, expire)
        try:
            with watching(state):
                await self._app(scope, receive, send_noting_start)
        except asyncio.CancelledError:
            # Ours: answer below. Anyone else's (shutdown, a client gone): theirs.
            if not expired or task is None or task.uncancel() > 0:
                raise
        else:
            if expired and task is not None:
                task.uncancel()  # the app swallowed our cancellation and answered itself
            return
        finally:
            timer.cancel()
        if started:
            return
        logger.warning(
            "request deadline exceeded: %s %s after %.1f s",
            scope.get("method", ""),
            scope.get("path", ""),
            self._seconds,
        )
        if self._on_expiry is not None:
            self._on_expiry()
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(EXPIRED_BODY)).encode()),
                    (b"retry-after", self._retry_after),
                ],
            }
        )
        await send({"type": "http.response.body", "body": EXPIRED_BODY})


def _consume(task: asyncio.Future) -> None:
    """Retrieve the outcome of a task the deadline gave up on (no 'never retrieved' noise)."""
    if not task.cancelled():
        task.exception()
