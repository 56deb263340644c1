"""The worker instances the core talks to: one pooled HTTP session each, used in turn.

``PINLOG_CORE_WORKER_BASE_URL`` may list several instances (comma-separated). Each call starts
at the next instance (round robin) and moves on when one refuses or cannot be reached, so a
dead or overloaded replica costs a retry, not a lost request. A load balancer in front of the
workers works too: give its one URL. A URL whose host is a DNS name may stand for many
instances: ``worker_discovery`` resolves it and replaces its one endpoint by one per address
(``WorkerEndpoints.replace``); an instance found that way gets work only once its ``/readyz``
was read (``in_turn``).

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
from collections.abc import Callable, Mapping, Sequence
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
        "_server_hostname",
        "_session",
        "_timeout",
        "_trace",
        "_urls",
        "base_url",
        "discovered",
        "judge_takes_batches",
        "max_request_bytes",
        "on_unreachable",
        "profile",
        "takes_batches",
    )

    def __init__(
        self,
        base_url: str,
        *,
        internal_secret: str,
        connect_timeout_seconds: float,
        read_timeout_seconds: float,
        trace: aiohttp.TraceConfig,
        host_header: str | None = None,
        discovered: bool = False,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        # One address of a DNS name (worker_discovery): it gets work only once its profile is
        # known; the name stays the Host header and, over TLS, the name checked.
        self.discovered = discovered
        # Called when a call could not connect (the discovery re-resolves its name).
        self.on_unreachable: Callable[[], None] | None = None
        # The embedding profile this instance last reported in /readyz (worker_routing);
        # None until known.
        self.profile: str | None = None
        # The largest request body it takes, as its /readyz last said; None until known.
        self.max_request_bytes: int | None = None
        # Whether its embedding provider and its judge take the Batch API ("batch",
        # "keywordBatch" of its last /readyz); None until known.
        self.takes_batches: bool | None = None
        self.judge_takes_batches: bool | None = None
        self._headers = {"X-Internal-Secret": internal_secret, "Content-Type": "application/json"}
        self._server_hostname: str | None = None
        if host_header is not None:
            self._headers["Host"] = host_header
            if self.base_url.startswith("https://"):
                self._server_hostname = host_header.rsplit(":", 1)[0].strip("[]")
        self._timeout = _timeouts(connect_timeout_seconds, read_timeout_seconds)
        self._trace = trace
        self._urls: dict[str, URL] = {}
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    @property
    def host_header(self) -> str | None:
        """The DNS name (and port) of a discovered address, sent as ``Host``; else ``None``."""
        return self._headers.get("Host")

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
                        server_hostname=self._server_hostname,
                    ) as answer:
                        # Read to the end: the connection goes back to the pool only then.
                        read = WorkerAnswer(answer.status, answer.headers, await answer.read())
            except (TimeoutError, aiohttp.ClientError) as exc:
                unanswered = _unanswered(exc, progress)
                if unanswered.cause in _NOT_CONNECTED and self.on_unreachable is not None:
                    self.on_unreachable()
                raise unanswered from exc
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


# Causes that say no connection was made (an instance gone, or its address reused).
_NOT_CONNECTED = frozenset({"ConnectError", "ConnectTimeout"})


def _timeouts(connect_seconds: float | None, read_seconds: float | None) -> aiohttp.ClientTimeout:
    # No total: the caller's deadline bounds the call, including a wait for a free connection.
    return aiohttp.ClientTimeout(
        total=None, connect=None, sock_connect=connect_seconds, sock_read=read_seconds
    )


class WorkerEndpoints:
    """The instances, handed out in round-robin order: one per configured URL, or, for a URL
    naming a DNS name, one per address it resolves to (``replace``)."""

    def __init__(
        self,
        endpoints: Sequence[WorkerEndpoint],
        *,
        internal_secret: str = "",
        connect_timeout_seconds: float = 1.0,
        read_timeout_seconds: float = 3.0,
        trace: aiohttp.TraceConfig | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("at least one worker endpoint is required")
        self._endpoints = tuple(endpoints)
        self._turn = itertools.count()
        self._internal_secret = internal_secret
        self._connect_timeout_seconds = connect_timeout_seconds
        self._read_timeout_seconds = read_timeout_seconds
        self._trace = trace or _send_trace()

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
            ],
            internal_secret=internal_secret,
            connect_timeout_seconds=connect_timeout_seconds,
            read_timeout_seconds=read_timeout_seconds,
            trace=trace,
        )

    def discovered_endpoint(self, base_url: str, *, host_header: str) -> WorkerEndpoint:
        """A new endpoint for one address of a DNS name (``base_url`` names the address,
        ``host_header`` the name), with the secret and timeouts of the others; not listed
        until ``replace``."""
        return WorkerEndpoint(
            base_url,
            internal_secret=self._internal_secret,
            connect_timeout_seconds=self._connect_timeout_seconds,
            read_timeout_seconds=self._read_timeout_seconds,
            trace=self._trace,
            host_header=host_header,
            discovered=True,
        )

    def replace(self, endpoints: Sequence[WorkerEndpoint]) -> None:
        """List ``endpoints`` from the next call on (possibly none: every instance of a name
        gone); calls under way keep the endpoint they hold. The caller closes the ones it
        dropped."""
        self._endpoints = tuple(endpoints)

    @property
    def all(self) -> tuple[WorkerEndpoint, ...]:
        return self._endpoints

    def in_turn(self, profile: str | None = None) -> list[WorkerEndpoint]:
        """Every endpoint once, starting at the next one in round-robin order; an address
        found by DNS only once its profile was read (``discovered``). With ``profile``: the
        endpoints known to serve it, then those whose profile is not known yet; those known
        to serve another are left out, unless no endpoint is left (then all, in case the
        knowledge is stale: a worker refuses work of another profile). Empty when no instance
        is known (a DNS name with no address)."""
        endpoints = [e for e in self._endpoints if not e.discovered or e.profile is not None]
        if not endpoints:
            return []
        start = next(self._turn) % len(endpoints)
        ordered = [*endpoints[start:], *endpoints[:start]]
        if profile is None:
            return ordered
        serving = [e for e in ordered if e.profile == profile]
        unknown = [e for e in ordered if e.profile is None]
        return serving + unknown or ordered

    async def aclose(self) -> None:
        for endpoint in self._endpoints:
            await endpoint.aclose()
