"""Worker instances found by DNS as they scale (docs/scaling.md "Workers found by DNS").

A URL of ``PINLOG_CORE_WORKER_BASE_URL`` whose host is an IP literal is used as given. One
whose host is a name (a Kubernetes headless Service, a compose service) may stand for many
instances: every ``PINLOG_CORE_WORKER_DNS_REFRESH_SECONDS``, and at once when a call to one of
its addresses could not connect, ``WorkerDiscovery`` resolves the name and lists one endpoint
per address (same scheme, port and path; the name stays the ``Host`` header). The name is
resolved with ``dnspython`` against ``PINLOG_CORE_WORKER_DNS_SERVERS`` when that is set (A and
AAAA records), otherwise through the system resolver (``getaddrinfo``: ``/etc/hosts`` and
``localhost`` keep working).

- A new address is asked for its ``/readyz`` before it is listed; it gets work only once its
  profile is known (``WorkerEndpoints.in_turn``), so a worker still starting gets none.
- An address the name no longer resolves to stops getting work at once; its client is closed
  after ``RETIRE_SECONDS``, when calls already holding it have ended.
- A name that does not exist, or has no address, lists no instance (every worker scaled away:
  dispatches are held and retried, searches answer 503). A resolution that fails (no answer
  from the DNS servers) keeps the addresses last found.
- Until a name was first resolved, its URL is used as given.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.resolver

from core_service.service.worker_endpoints import WorkerEndpoint, WorkerEndpoints
from core_service.service.worker_readiness import ReadinessReader, display_url
from core_service.service.worker_routing import read_profiles

logger = logging.getLogger(__name__)

# Seconds a resolution may take in all (every DNS server and record type).
RESOLVE_DEADLINE_SECONDS = 2.0
# Shortest gap between two resolutions asked for by connection failures (seconds).
MIN_REFRESH_GAP_SECONDS = 1.0
# A dropped address's client is closed this long after it was dropped: longer than any call
# deadline (a search's 12 s, a backfill batch's), so no call under way is cut.
RETIRE_SECONDS = 60.0


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


@dataclass
class _Name:
    """One configured URL whose host is a DNS name, and the endpoints of its addresses."""

    url: str
    as_given: WorkerEndpoint
    by_address: dict[str, WorkerEndpoint] | None = None  # None: not resolved yet

    @property
    def endpoints(self) -> list[WorkerEndpoint]:
        if self.by_address is None:
            return [self.as_given]
        return [self.by_address[address] for address in sorted(self.by_address)]


class WorkerDiscovery:
    """Keeps ``endpoints`` listing every address of the configured names (module docstring);
    ``refresh_once``, ``run_forever``; ``aclose`` closes the clients it made."""

    def __init__(
        self,
        endpoints: WorkerEndpoints,
        *,
        dns_servers: Sequence[tuple[str, int]] = (),
        refresh_seconds: float,
    ) -> None:
        self._endpoints = endpoints
        self._refresh_seconds = refresh_seconds
        self._fixed: list[WorkerEndpoint] = []
        self._names: list[_Name] = []
        for endpoint in endpoints.all:
            if is_ip_literal(urlsplit(endpoint.base_url).hostname or ""):
                self._fixed.append(endpoint)
            else:
                endpoint.on_unreachable = self.request_refresh
                self._names.append(_Name(endpoint.base_url, endpoint))
        self._resolver: dns.asyncresolver.Resolver | None = None
        if dns_servers:
            self._resolver = dns.asyncresolver.Resolver(configure=False)
            self._resolver.nameservers = [
                dns.nameserver.Do53Nameserver(address, port) for address, port in dns_servers
            ]
            self._resolver.lifetime = RESOLVE_DEADLINE_SECONDS
        self._reader = ReadinessReader([endpoint.base_url for endpoint in endpoints.all])
        self._wake = asyncio.Event()
        self._refreshed_at = -MIN_REFRESH_GAP_SECONDS
        self._retiring: set[asyncio.Task] = set()

    @property
    def instances(self) -> list[WorkerEndpoint]:
        """Every endpoint listed now, addresses not yet read included (the operator commands
        report each one)."""
        return [*self._fixed, *(endpoint for name in self._names for endpoint in name.endpoints)]

    @property
    def has_names(self) -> bool:
        """True when some configured URL names a DNS name (else there is nothing to do)."""
        return bool(self._names)

    def request_refresh(self) -> None:
        """Resolve again soon (a call could not connect to an address); never blocks."""
        self._wake.set()

    async def refresh_once(self) -> None:
        """Resolve every name once, read the new addresses' ``/readyz``, then list them and
        drop the addresses gone; never raises for DNS or worker faults."""
        self._refreshed_at = time.monotonic()
        new: list[WorkerEndpoint] = []
        dropped: list[WorkerEndpoint] = []
        for name in self._names:
            parts = urlsplit(name.url)
            addresses = await self._resolve(parts.hostname or "", _port(parts))
            if addresses is None:
                continue
            before = name.by_address
            current = {} if before is None else before
            found = {}
            for address in addresses:
                endpoint = current.get(address)
                if endpoint is None:
                    endpoint = self._endpoints.discovered_endpoint(
                        _url_at(parts, address), host_header=parts.netloc.rpartition("@")[2]
                    )
                    endpoint.on_unreachable = self.request_refresh
                    new.append(endpoint)
                found[address] = endpoint
            dropped += [e for a, e in current.items() if a not in found]
            if before is None:
                dropped.append(name.as_given)
            if set(found) != set(current) or before is None:
                logger.info("worker name %s: %d address(es)", display_url(name.url), len(found))
            name.by_address = found
        if new:
            await read_profiles(self._reader, new)
        self._endpoints.replace(self.instances)
        for endpoint in dropped:
            task = asyncio.create_task(_close_later(endpoint))
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _resolve(self, host: str, port: int) -> list[str] | None:
        """The addresses of ``host``, sorted; ``[]`` when it has none (no such name, no
        record); ``None`` when the resolution failed."""
        try:
            async with asyncio.timeout(RESOLVE_DEADLINE_SECONDS * 2):
                if self._resolver is not None:
                    return await self._resolve_with_dns(host)
                infos = await asyncio.get_running_loop().getaddrinfo(
                    host, port, type=socket.SOCK_STREAM
                )
        except socket.gaierror as exc:
            if exc.errno in _NO_SUCH_NAME:
                return []
            logger.warning("worker name not resolved (%s)", type(exc).__name__)
            return None
        except (TimeoutError, OSError) as exc:
            logger.warning("worker name not resolved (%s)", type(exc).__name__)
            return None
        return sorted({str(info[4][0]) for info in infos})

    async def _resolve_with_dns(self, host: str) -> list[str] | None:
        assert self._resolver is not None
        found: set[str] = set()
        answered = False
        for record_type in ("A", "AAAA"):
            try:
                answer = await self._resolver.resolve(host, record_type, search=False)
            except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
                answered = True
                continue
            except dns.exception.DNSException as exc:
                logger.warning("worker name not resolved (%s)", type(exc).__name__)
                continue
            answered = True
            found |= {record.address for record in answer}
        return sorted(found) if answered else None

    async def run_forever(self, stop: asyncio.Event) -> None:
        """Resolve every ``refresh_seconds``, and soon after a connection failure, until
        ``stop``."""
        try:
            while not stop.is_set():
                waiter = asyncio.create_task(self._wake.wait())
                stopper = asyncio.create_task(stop.wait())
                await asyncio.wait(
                    {waiter, stopper},
                    timeout=self._refresh_seconds,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                woken = waiter.done()
                waiter.cancel()
                stopper.cancel()
                if stop.is_set():
                    return
                self._wake.clear()
                # Failures may come in bursts (every call to a vanished address): one
                # resolution per MIN_REFRESH_GAP_SECONDS for them, the timer's own as set.
                gap = MIN_REFRESH_GAP_SECONDS - (time.monotonic() - self._refreshed_at)
                if woken and gap > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), gap)
                    if stop.is_set():
                        return
                try:
                    await self.refresh_once()
                except Exception:
                    logger.exception("worker name resolution failed; continuing")
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Close the readiness client and every client of a dropped address now."""
        await self._reader.aclose()
        for task in list(self._retiring):
            task.cancel()
        for task in list(self._retiring):
            with contextlib.suppress(asyncio.CancelledError):
                await task


# getaddrinfo's answers for a name that does not exist or has no address.
_NO_SUCH_NAME = frozenset(
    code
    for code in (getattr(socket, "EAI_NONAME", None), getattr(socket, "EAI_NODATA", None))
    if code is not None
)


def _port(parts) -> int:
    return parts.port or (443 if parts.scheme == "https" else 80)


def _url_at(parts, address: str) -> str:
    """The configured URL with its host replaced by ``address`` (and the port made
    explicit)."""
    host = f"[{address}]" if ":" in address else address
    return urlunsplit((parts.scheme, f"{host}:{_port(parts)}", parts.path, "", ""))


async def _close_later(endpoint: WorkerEndpoint) -> None:
    try:
        await asyncio.sleep(RETIRE_SECONDS)
    finally:
        await endpoint.aclose()
