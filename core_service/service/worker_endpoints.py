"""The worker instances the core talks to: one pooled HTTP session each, used in turn.

``PINLOG_CORE_WORKER_BASE_URL`` may list several instances (comma-separated). Each call starts
at the next instance (round robin) and moves on when one refuses or cannot be reached, so a
dead or overloaded replica costs a retry, not a lost request. A load balancer in front of the
workers works too: give its one URL.

``WorkerEndpoint.post_json`` sends one JSON body (``orjson``, UTF-8) with
``X-Internal-Secret`` (§8) and returns the whole answer (``WorkerAnswer``: status, headers,
body bytes), whatever its status. When no answer comes it raises ``WorkerUnanswered``, which
says in words that do not depend on the HTTP library what happened (``cause``) and whether
the whole request had been handed to the connection first (``whole_request_sent``):

- ``ConnectError``: refused, reset or closed before any of the request was sent;
- ``ConnectTimeout``: timed out before any of it was sent (connecting, or waiting for a
  pooled connection); ``WriteTimeout``: timed out with part of it sent;
- ``ReadTimeout``: timed out after the whole request was sent (the read timeout between two
  reads of the answer, or the call's deadline);
- ``ConnectionLost``: the connection broke once sending began, before a whole answer;
- ``RemoteProtocolError``: the answer is not well-formed HTTP.

Timeouts: ``connect_timeout_seconds`` bounds opening a connection, ``read_timeout_seconds``
each wait for answer bytes once the request is out, and ``deadline_seconds`` the whole call
(a worker dripping bytes would otherwise hold it forever).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import aiohttp
import orjson
from yarl import URL

from pinlog_platform import tracing

# Idle pooled connections are dropped after this many seconds, before the worker's keep-alive
# (uvicorn's default is 5 s) closes them under a request.
KEEPALIVE_EXPIRY_SECONDS = 2.0
# Connections open to one instance at most; further calls wait for one to be free.
MAX_CONNECTIONS = 32


@dataclass(frozen=True, slots=True)
class WorkerAnswer:
    """A worker's whole answer; ``headers`` is case-insensitive."""

    status: int
    headers: Mapping[str, str]
    body: bytes


class WorkerUnanswered(Exception):
    """No answer from one instance; ``cause`` is one of the words of the module docstring."""

    def __init__(self, cause: str, *, timed_out: bool, whole_request_sent: bool) -> None:
        super().__init__(cause)
        self.cause = cause
        self.timed_out = timed_out
        self.whole_request_sent = whole_request_sent


class _SendProgress:
    """Bytes of one request's body handed to the connection so far (the ``trace_request_ctx``
    of a call). The body is JSON, never empty: no bytes sent means nothing was sent."""

    __slots__ = ("body_bytes", "sent_bytes")

    def __init__(self, body_bytes: int) -> None:
        self.body_bytes = body_bytes
        self.sent_bytes = 0

    @property
    def whole(self) -> bool:
        return self.sent_bytes >= self.body_bytes


async def _count_chunk(
    _session: aiohttp.ClientSession,
    context: SimpleNamespace,
    params: aiohttp.TraceRequestChunkSentParams,
) -> None:
    # aiohttp signals each body chunk just before it writes it to the transport (the headers
    # go out with the first chunk), so the count is what the connection was given.
    progress = context.trace_request_ctx
    if isinstance(progress, _SendProgress):
        progress.sent_bytes += len(params.chunk)


def _send_trace() -> aiohttp.TraceConfig:
    trace = aiohttp.TraceConfig()
    trace.on_request_chunk_sent.append(_count_chunk)
    return trace


def _unanswered(exc: BaseException, progress: _SendProgress) -> WorkerUnanswered:
    """``exc`` (a timeout or an aiohttp error) in the module docstring's words."""
    whole = progress.whole
    if isinstance(exc, TimeoutError):
        if progress.sent_bytes == 0:
            cause = "ConnectTimeout"
        else:
            cause = "ReadTimeout" if whole else "WriteTimeout"
        return WorkerUnanswered(cause, timed_out=True, whole_request_sent=whole)
    if isinstance(exc, aiohttp.ClientResponseError | aiohttp.ClientPayloadError):
        cause = "RemoteProtocolError"
    elif progress.sent_bytes == 0:
        cause = "ConnectError"
    else:
        cause = "ConnectionLost"
    return WorkerUnanswered(cause, timed_out=False, whole_request_sent=whole)


class WorkerEndpoint:
    """One worker instance: its base URL (as configured, without a trailing ``/``) and a
    keep-alive session, opened on first use inside the running event loop. A call after
    ``aclose`` is not sent (``ConnectError``)."""

    __slots__ = (
        "_closed",
        "_headers",
        "_session",
        "_timeout",
        "_trace",
        "_urls",
        "base_url",
        "max_request_bytes",
        "profile",
    )

    def __init__(
        self,
        base_url: str,
        *,
        internal_secret: str,
        connect_timeout_seconds: float,
        read_timeout_seconds: float,
        trace: aiohttp.TraceConfig,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        # The embedding profile this instance last reported in /readyz (worker_routing);
        # None until known.
        self.profile: str | None = None
        # The largest request body it takes, as its /readyz last said; None until known.
        self.max_request_bytes: int | None = None
        self._headers = {"X-Internal-Secret": internal_secret, "Content-Type": "application/json"}
        self._timeout = _timeouts(connect_timeout_seconds, read_timeout_seconds)
        self._trace = trace
        self._urls: dict[str, URL] = {}
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    async def post_json(
        self,
        path: str,
        payload: object,
        *,
        deadline_seconds: float,
        connect_timeout_seconds: float | None = None,
        read_timeout_seconds: float | None = None,
    ) -> WorkerAnswer:
        """POST ``payload`` as JSON to ``path`` (``/internal/v1/...``) within
        ``deadline_seconds``; the timeouts given replace the endpoint's for this call.
        Raises ``WorkerUnanswered`` when no whole answer came."""
        body = orjson.dumps(payload)
        progress = _SendProgress(len(body))
        # Always given: aiohttp reads timeout=None as "no timeouts at all".
        timeout = self._timeout
        if connect_timeout_seconds is not None or read_timeout_seconds is not None:
            timeout = _timeouts(
                connect_timeout_seconds or self._timeout.sock_connect,
                read_timeout_seconds or self._timeout.sock_read,
            )
        # The span and the traceparent the worker continues; the span names the path only.
        with tracing.span(f"POST {path}", kind="client", path=path) as call:
            try:
                async with asyncio.timeout(deadline_seconds):
                    async with self._open().post(
                        self._url(path),
                        data=body,
                        headers=tracing.outgoing_headers(),
                        timeout=timeout,
                        allow_redirects=False,
                        trace_request_ctx=progress,
                    ) as answer:
                        # Read to the end: the connection goes back to the pool only then.
                        read = WorkerAnswer(answer.status, answer.headers, await answer.read())
            except (TimeoutError, aiohttp.ClientError) as exc:
                raise _unanswered(exc, progress) from exc
            if call is not None:
                call.set_attribute("http.response.status_code", read.status)
            return read

    async def aclose(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()

    def _open(self) -> aiohttp.ClientSession:
        if self._closed:
            raise aiohttp.ClientConnectionError("worker endpoint closed")
        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                timeout=self._timeout,
                trace_configs=[self._trace],
                connector=aiohttp.TCPConnector(
                    limit=MAX_CONNECTIONS, keepalive_timeout=KEEPALIVE_EXPIRY_SECONDS
                ),
            )
        return self._session

    def _url(self, path: str) -> URL:
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = URL(self.base_url + path)
        return url


def _timeouts(connect_seconds: float | None, read_seconds: float | None) -> aiohttp.ClientTimeout:
    # No total: the caller's deadline bounds the call, including a wait for a free connection.
    return aiohttp.ClientTimeout(
        total=None, connect=None, sock_connect=connect_seconds, sock_read=read_seconds
    )


class WorkerEndpoints:
    """The configured instances, handed out in round-robin order."""

    def __init__(self, endpoints: Sequence[WorkerEndpoint]) -> None:
        if not endpoints:
            raise ValueError("at least one worker endpoint is required")
        self._endpoints = tuple(endpoints)
        self._turn = itertools.count()

    @classmethod
    def connect(
        cls,
        base_urls: Sequence[str],
        *,
        internal_secret: str,
        connect_timeout_seconds: float,
        read_timeout_seconds: float,
    ) -> WorkerEndpoints:
        """One endpoint per URL, each sending ``X-Internal-Secret`` (§8); no connection is
        opened before the first call."""
        trace = _send_trace()
        return cls(
            [
                WorkerEndpoint(
                    url,
                    internal_secret=internal_secret,
                    connect_timeout_seconds=connect_timeout_seconds,
                    read_timeout_seconds=read_timeout_seconds,
                    trace=trace,
                )
                for url in base_urls
            ]
        )

    @property
    def all(self) -> tuple[WorkerEndpoint, ...]:
        return self._endpoints

    def in_turn(self, profile: str | None = None) -> list[WorkerEndpoint]:
        """Every endpoint once, starting at the next one in round-robin order. With
        ``profile``: the endpoints known to serve it, then those whose profile is not known
        yet; those known to serve another are left out, unless no endpoint is left (then all,
        in case the knowledge is stale: a worker refuses work of another profile)."""
        start = next(self._turn) % len(self._endpoints)
        ordered = [*self._endpoints[start:], *self._endpoints[:start]]
        if profile is None:
            return ordered
        serving = [e for e in ordered if e.profile == profile]
        unknown = [e for e in ordered if e.profile is None]
        return serving + unknown or ordered

    async def aclose(self) -> None:
        for endpoint in self._endpoints:
            await endpoint.aclose()
