"""What each worker instance reports about itself: its ``GET /readyz`` body, read over HTTP.

The body is pinned by the worker (docs/operations.md "Readiness"): ``{"status", "mode",
"profile", "presetVersion", "maxRequestBytes", "batch", "keywordBatch", "providers", ...}``.
The core reads ``status``, ``profile``, ``presetVersion``, ``maxRequestBytes``, ``batch`` and
``keywordBatch`` of every instance
listed in ``PINLOG_CORE_WORKER_BASE_URL``, each on its own (a load balancer URL answers for
one replica at a time: list the replicas themselves where every one must be seen).
``/readyz`` needs no secret. Nothing here writes or logs; callers decide.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp

from pinlog_platform.contract.request_limits import MAX_REQUEST_BYTES, MIN_REQUEST_BYTES

READYZ_PATH = "/readyz"
# The worker answers /readyz within 1 s in every state; a little more for the network.
DEFAULT_TIMEOUT_SECONDS = 3.0
# A body larger than this is not a readiness body.
MAX_BODY_BYTES = 64 * 1024


@dataclass(frozen=True, slots=True)
class WorkerReadiness:
    """One instance's answer. ``problem`` is a short fixed text when the body could not be
    read (``unreachable (ClientConnectorError)``, ``HTTP 404``, ``not a readiness body``);
    then the other fields are ``None``/``False``. ``ready``: ``status == "ready"`` (HTTP
    200); ``preset_version`` ``None`` before the worker loaded presets; ``max_request_bytes``
    the largest body the instance takes (``None``: not reported, a worker before it did);
    ``batch``: its provider takes the Batch API (``False`` when not reported);
    ``keyword_batch``: its judge does (``keywordBatch``; ``False`` when not reported)."""

    base_url: str
    ready: bool = False
    profile: str | None = None
    preset_version: int | None = None
    problem: str | None = None
    max_request_bytes: int | None = None
    batch: bool = False
    keyword_batch: bool = False

    def describe(self) -> str:
        """``http://w1:8000: profile P, list version 3, ready`` and the like (the URL without
        any user information)."""
        where = display_url(self.base_url)
        if self.problem is not None:
            return f"{where}: {self.problem}"
        state = "ready" if self.ready else "not ready"
        return f"{where}: profile {self.profile}, list version {self.preset_version}, {state}"


def display_url(base_url: str) -> str:
    """``base_url`` as it may be printed: scheme, host, port and path, never user or password."""
    parts = urlsplit(base_url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port is not None else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


class ReadinessReader:
    """Reads ``/readyz`` of every instance at once, with one pooled client; ``aclose`` it."""

    def __init__(
        self,
        base_urls: Sequence[str],
        *,
        timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        host_headers: Sequence[str | None] | None = None,
    ) -> None:
        if not base_urls:
            raise ValueError("at least one worker base URL is required")
        self._base_urls = tuple(url.rstrip("/") for url in base_urls)
        # The DNS name of each URL naming one address of it (worker_discovery), else None.
        self._host_headers = tuple(host_headers or [None] * len(self._base_urls))
        self._timeout_seconds = timeout_seconds
        self._session: aiohttp.ClientSession | None = None

    @property
    def base_urls(self) -> tuple[str, ...]:
        return self._base_urls

    async def read_all(
        self,
        base_urls: Sequence[str] | None = None,
        host_headers: Sequence[str | None] | None = None,
    ) -> list[WorkerReadiness]:
        """Every instance's readiness, in the order listed (``base_urls``: these instead of the
        ones given at construction, each with its ``Host`` header when ``host_headers`` gives
        one); never raises for worker or network faults (they become ``problem``)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._timeout_seconds)
            )
        urls = self._base_urls if base_urls is None else tuple(base_urls)
        hosts = host_headers if host_headers is not None else [None] * len(urls)
        if base_urls is None:
            hosts = self._host_headers
        return list(
            await asyncio.gather(
                *(self._read(url, host) for url, host in zip(urls, hosts, strict=True))
            )
        )

    async def _read(self, base_url: str, host_header: str | None = None) -> WorkerReadiness:
        assert self._session is not None
        headers = {"Host": host_header} if host_header is not None else None
        # Over TLS an address found by DNS is checked against the name, not the address.
        tls_name = None
        if host_header is not None and base_url.startswith("https://"):
            tls_name = host_header.rsplit(":", 1)[0].strip("[]")
        try:
            async with self._session.get(
                base_url + READYZ_PATH, headers=headers, server_hostname=tls_name
            ) as response:
                if response.status not in (200, 503):
                    return WorkerReadiness(base_url, problem=f"HTTP {response.status}")
                raw = await _body_up_to(response, MAX_BODY_BYTES + 1)
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            return WorkerReadiness(base_url, problem=f"unreachable ({type(exc).__name__})")
        return _parse(base_url, status, raw)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _body_up_to(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body to its end or to ``limit`` bytes, whichever comes first: one ``read(n)``
    returns what has arrived so far, which may be part of a body sent in several packets."""
    parts: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(16384):
        parts.append(chunk)
        size += len(chunk)
        if size >= limit:
            break
    return b"".join(parts)[:limit]


def _parse(base_url: str, status: int, raw: bytes) -> WorkerReadiness:
    """The pinned fields of a ``/readyz`` body, or ``not a readiness body``."""
    not_readiness = WorkerReadiness(base_url, problem="not a readiness body")
    if len(raw) > MAX_BODY_BYTES:
        return not_readiness
    try:
        body = json.loads(raw)
    except ValueError:
        return not_readiness
    if not isinstance(body, dict):
        return not_readiness
    profile, version = body.get("profile"), body.get("presetVersion")
    if not isinstance(profile, str) or not (version is None or _is_int(version)):
        return not_readiness
    return WorkerReadiness(
        base_url,
        ready=status == 200 and body.get("status") == "ready",
        profile=profile,
        preset_version=version,
        max_request_bytes=_request_limit(body.get("maxRequestBytes")),
        batch=body.get("batch") is True,
        keyword_batch=body.get("keywordBatch") is True,
    )


def _request_limit(value: object) -> int | None:
    """A reported body limit in bytes within what a worker may be configured to; ``None``
    (unknown: the default cut applies) for anything else."""
    if _is_int(value) and MIN_REQUEST_BYTES <= value <= MAX_REQUEST_BYTES:
        return value
    return None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
