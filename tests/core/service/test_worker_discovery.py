"""Workers found by DNS as they scale (core_service/service/worker_discovery.py; docs/scaling.md
"Workers found by DNS"): ``PINLOG_CORE_WORKER_BASE_URL`` names ``workers.pinlog.test``, which a
real DNS server run by the test (``tests/dns_server.py``) resolves to a changing set of
loopback addresses, each served by a stand-in worker on the same port, as the pods of a
headless Service are. Notes are created through the core's client API; where each process
request lands is what the workers recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator

import pytest
import uvicorn
from pydantic import ValidationError

from core_service.composition import open_operations
from core_service.service.worker_discovery import WorkerDiscovery
from core_service.service.worker_endpoints import WorkerEndpoints
from tests.core.harness import core_settings, running_core
from tests.dns_server import LocalDnsServer
from tests.e2e.observe import metric
from tests.fake_worker import FakeWorker
from tests.worker.harness import SECRET

NAME = "workers.pinlog.test"
ADDRESSES = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
# An address the name lists where no worker listens.
NOBODY = "127.0.0.9"


@contextlib.asynccontextmanager
async def serving_at(app, host: str, port: int) -> AsyncIterator[None]:
    """Serve ``app`` with uvicorn on ``host:port`` until the block ends."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, access_log=False))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                await task
            await asyncio.sleep(0.01)
        yield
    finally:
        server.should_exit = True
        await task


@pytest.fixture
def dns():
    with LocalDnsServer() as server:
        yield server


class Workers:
    """A stand-in worker on each of ``ADDRESSES``, all on one ``port``; ``stop`` ends one's
    server (connections to it are then refused)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.at = {address: FakeWorker(SECRET) for address in ADDRESSES}
        self._servers: dict[str, contextlib.AsyncExitStack] = {}

    async def start(self) -> None:
        for address, worker in self.at.items():
            stack = contextlib.AsyncExitStack()
            await stack.enter_async_context(serving_at(worker.app, address, self.port))
            self._servers[address] = stack

    async def stop(self, address: str) -> None:
        await self._servers.pop(address).aclose()

    async def stop_all(self) -> None:
        for address in list(self._servers):
            await self.stop(address)


@pytest.fixture
async def workers() -> AsyncIterator[Workers]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    running = Workers(port)
    try:
        await running.start()
        yield running
    finally:
        await running.stop_all()


def _core(migrated_database, base_url: str, dns: LocalDnsServer | None, refresh: float = 0.2):
    return running_core(
        core_settings(
            migrated_database,
            base_url,
            worker_dns_servers=None if dns is None else dns.address,
            worker_dns_refresh_seconds=refresh,
        )
    )


async def _create(core, n: int, tag: str) -> None:
    for i in range(n):
        response = await core.create(1, f"창가 자리 조용한 카페 {tag} {i}", place=f"{tag}-{i}")
        assert response.status_code == 201, response.text


async def _delivered(workers: dict[str, FakeWorker], total: int) -> dict[str, int]:
    """Wait until ``total`` process requests arrived in all; how many at each address."""
    async with asyncio.timeout(10):
        while sum(len(w.requests) for w in workers.values()) < total:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    return {address: len(w.requests) for address, w in workers.items()}


async def _next_resolutions(dns: LocalDnsServer, count: int = 2) -> None:
    """Until the core has asked for the name ``count`` more times (A and AAAA: one round)."""
    start = dns.resolver.asked(NAME)
    async with asyncio.timeout(10):
        while dns.resolver.asked(NAME) < start + count * 2:  # noqa: ASYNC110
            await asyncio.sleep(0.02)


async def test_work_is_spread_across_every_address_and_ip_literals_are_used_as_given(
    migrated_database, members, dns, workers, fake_worker
):
    port, by_address = workers.port, workers.at
    dns.resolver.answers[NAME] = ["127.0.0.2", "127.0.0.3"]
    urls = f"http://{NAME}:{port},{fake_worker.base_url}"
    async with _core(migrated_database, urls, dns) as core:
        await _create(core, 9, "spread")
        counts = await _delivered({**by_address, "literal": fake_worker}, 9)

    # In turn: three each, unless a connection attempt timed out on the loaded machine and
    # the dispatch moved on to the next instance.
    assert counts["127.0.0.2"] > 0 and counts["127.0.0.3"] > 0 and counts["literal"] > 0
    assert counts["127.0.0.4"] == 0
    assert {name for name, _ in dns.resolver.queries} == {NAME}  # the literal never asked


async def test_a_new_worker_gets_work_within_seconds_and_a_removed_one_stops_getting_it(
    migrated_database, members, dns, workers
):
    port, by_address = workers.port, workers.at
    dns.resolver.answers[NAME] = ["127.0.0.2"]
    async with _core(migrated_database, f"http://{NAME}:{port}", dns) as core:
        await _create(core, 2, "one")
        assert await _delivered(by_address, 2) == {"127.0.0.2": 2, "127.0.0.3": 0, "127.0.0.4": 0}

        dns.resolver.answers[NAME] = ["127.0.0.2", "127.0.0.3"]  # scaled up
        await _next_resolutions(dns)
        await _create(core, 4, "two")
        scaled_up = await _delivered(by_address, 6)
        assert scaled_up["127.0.0.3"] > 0  # two each, in turn
        assert scaled_up["127.0.0.4"] == 0

        dns.resolver.answers[NAME] = ["127.0.0.3"]  # 127.0.0.2's pod went away
        await _next_resolutions(dns)
        await _create(core, 3, "three")
        assert await _delivered(by_address, 9) == {
            "127.0.0.2": scaled_up["127.0.0.2"],
            "127.0.0.3": scaled_up["127.0.0.3"] + 3,
            "127.0.0.4": 0,
        }


async def test_an_address_whose_readyz_was_not_read_gets_no_work(
    migrated_database, members, dns, workers
):
    """127.0.0.4 answers its /readyz with no profile (not a readiness body): it is never sent a
    note, not even when the one known worker refuses (an instance of unknown profile would be
    tried next)."""
    by_address = workers.at
    by_address["127.0.0.2"].mode = "refuse"
    by_address["127.0.0.4"].profile = None
    dns.resolver.answers[NAME] = ["127.0.0.2", "127.0.0.4"]
    async with _core(migrated_database, f"http://{NAME}:{workers.port}", dns) as core:
        await _create(core, 1, "unread")
        ops = str(core.ops.base_url)
        async with asyncio.timeout(10):
            while await metric(ops, "pinlog_core_dispatches_total", result="refused") < 1:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        assert len(by_address["127.0.0.2"].requests) == 1
        assert by_address["127.0.0.4"].requests == []


async def test_a_connection_failure_resolves_the_name_again_at_once(
    migrated_database, members, dns, workers, caplog
):
    """Refreshes every 60 s, yet a worker that stops answering is dropped within about a
    second of the first call that could not connect to it: that call asks for the name again."""
    caplog.set_level(logging.INFO, logger="core_service.service.worker_discovery")
    port, by_address = workers.port, workers.at
    dns.resolver.answers[NAME] = ["127.0.0.2", "127.0.0.4"]
    async with _core(migrated_database, f"http://{NAME}:{port}", dns, refresh=60) as core:
        asked = dns.resolver.asked(NAME)
        dns.resolver.answers[NAME] = ["127.0.0.2"]
        await workers.stop("127.0.0.4")
        await _create(core, 4, "failure")
        async with asyncio.timeout(10):
            while dns.resolver.asked(NAME) <= asked:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        async with asyncio.timeout(10):  # that round ended: 127.0.0.4 is dropped
            while not any("1 address(es)" in r.getMessage() for r in caplog.records):  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        before = await _delivered(by_address, 4)
        await _create(core, 3, "after")
        after = await _delivered(by_address, 7)
        assert after["127.0.0.2"] - before["127.0.0.2"] == 3


async def test_without_dns_servers_names_are_resolved_by_the_system_resolver(
    migrated_database, members, fake_worker
):
    """``localhost`` through getaddrinfo (``/etc/hosts``): the worker on 127.0.0.1 gets the
    work; an address of it where nothing listens (::1) gets none."""
    port = fake_worker.base_url.rsplit(":", 1)[1]
    async with _core(migrated_database, f"http://localhost:{port}", None) as core:
        await _create(core, 3, "system")
        await fake_worker.wait_for_requests(3)


def test_ip_literals_alone_need_no_discovery():
    endpoints = WorkerEndpoints.connect(
        ["http://127.0.0.1:1", "http://[::1]:2"],
        internal_secret=SECRET,
        connect_timeout_seconds=1,
        read_timeout_seconds=1,
    )
    assert not WorkerDiscovery(endpoints, refresh_seconds=1).has_names


@pytest.mark.parametrize(
    ("value", "servers"),
    [
        ("10.0.0.10", (("10.0.0.10", 53),)),
        ("127.0.0.1:5353,[::1]:53,::1", (("127.0.0.1", 5353), ("::1", 53), ("::1", 53))),
        ("dns.example", None),
        ("10.0.0.10:0", None),
        ("10.0.0.10:dns", None),
        ("[::1]53", None),
    ],
)
def test_dns_servers_are_ip_addresses_with_an_optional_port(migrated_database, value, servers):
    if servers is None:
        with pytest.raises(ValidationError, match="IP or IP:PORT") as raised:
            core_settings(migrated_database, "http://w:1", worker_dns_servers=value)
        assert value not in str(raised.value)
    else:
        settings = core_settings(migrated_database, "http://w:1", worker_dns_servers=value)
        assert settings.worker_dns_server_addresses == servers


async def test_operator_commands_read_every_address_of_a_name(migrated_database, dns, workers):
    """``pinlog-core reprocess keywords`` and ``reembed`` wait for every worker instance: a
    name's are each of its addresses, not the one a connection would pick."""
    dns.resolver.answers[NAME] = ["127.0.0.2", "127.0.0.3"]
    settings = core_settings(
        migrated_database, f"http://{NAME}:{workers.port}", worker_dns_servers=dns.address
    )
    async with open_operations(settings) as ops:
        readings = await ops.readings()
    assert sorted(r.base_url for r in readings) == [
        f"http://127.0.0.2:{workers.port}",
        f"http://127.0.0.3:{workers.port}",
    ]
    assert all(r.ready and r.profile == workers.at["127.0.0.2"].profile for r in readings)
