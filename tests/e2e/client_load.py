"""Members' searches and reads through the core processes' client API while an operation runs,
each answer checked against the records it must show (e2e tests of long operations).

``Cores`` sends each request to the core processes in turn, as a load balancer would, and
moves a request to the next process when one cannot be reached (a process killed on purpose);
``ClientLoad`` keeps searching and reading at a steady pace and keeps every ``Answer``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import httpx

from tests.core.harness import bearer
from tests.e2e.processes import ServiceProcess

SEARCH_PATH = "/api/v1/search"
# Tries of one request across the processes before giving up (about 10 s with the pause).
FAILOVER_TRIES = 200
FAILOVER_PAUSE_SECONDS = 0.05


class Cores:
    """The client API of several core processes. A request that could not be sent (connection
    refused) goes to the next process; a search or read whose connection broke after it was
    sent too (they change nothing). Each move is counted in ``failovers``."""

    def __init__(self, processes: Sequence[ServiceProcess]) -> None:
        self._processes = processes
        self._turn = itertools.count()
        self._client = httpx.AsyncClient(timeout=30)
        self.failovers = 0

    async def request(self, method: str, path: str, *, member: int, **kwargs) -> httpx.Response:
        repeatable = method == "GET" or path == SEARCH_PATH
        for _ in range(FAILOVER_TRIES):
            process = self._processes[next(self._turn) % len(self._processes)]
            try:
                return await self._client.request(
                    method, process.base_url + path, headers=bearer(member), **kwargs
                )
            except httpx.TransportError as exc:
                if not repeatable and not isinstance(exc, httpx.ConnectError):
                    raise
                self.failovers += 1
                await asyncio.sleep(FAILOVER_PAUSE_SECONDS)
        raise AssertionError(f"no core process answered {method} {path}")

    async def aclose(self) -> None:
        await self._client.aclose()


@dataclass
class Answer:
    """One search or read: when it started (monotonic), its status and latency (s); how many
    of the member's ``stable`` records it did not show, how many of them it showed without
    keywords (reads), and how many records it showed that were deleted before it started."""

    kind: str  # "search" or "read"
    at: float
    status: int
    seconds: float
    missing: int = 0
    unkeyworded: int = 0
    shown_gone: int = 0

    @property
    def complete(self) -> bool:
        return self.status == 200 and not (self.missing or self.unkeyworded or self.shown_gone)


@dataclass
class ClientLoad:
    """Searches for ``query`` (limit 100) and reads of the member's list of records (limit
    100), the members in turn, at ``searches_per_second`` and ``reads_per_second`` (a slow
    answer does not slow the pace), from ``start`` until ``stop``.

    ``stable``: per member, the records every answer must show (reads: with keywords);
    ``gone``: record -> when its delete was answered (monotonic), never shown after that."""

    cores: Cores
    members: Sequence[int]
    query: str
    searches_per_second: float
    reads_per_second: float
    stable: dict[int, set[int]] = field(default_factory=dict)
    gone: dict[int, float] = field(default_factory=dict)
    answers: list[Answer] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._paced(self.searches_per_second, self._search)),
            asyncio.create_task(self._paced(self.reads_per_second, self._read)),
        ]

    async def stop(self) -> None:
        """Stop and wait for the answers in flight (again: nothing)."""
        self._stop.set()
        await asyncio.gather(*self._tasks)

    def of(self, kind: str, since: float = 0.0, until: float = float("inf")) -> list[Answer]:
        """The answers of ``kind`` to requests started in [since, until) (monotonic)."""
        return [a for a in self.answers if a.kind == kind and since <= a.at < until]

    async def _paced(self, per_second: float, one: Callable[[int], Awaitable[None]]) -> None:
        loop = asyncio.get_running_loop()
        in_flight: set[asyncio.Task[None]] = set()
        next_at = loop.time()
        for turn in itertools.count():
            if self._stop.is_set():
                break
            task = asyncio.create_task(one(self.members[turn % len(self.members)]))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
            next_at += 1 / per_second
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), max(next_at - loop.time(), 0))
        await asyncio.gather(*in_flight)

    async def _search(self, member: int) -> None:
        started = time.monotonic()
        response = await self.cores.request(
            "POST", SEARCH_PATH, member=member, json={"query": self.query, "limit": 100}
        )
        answer = Answer("search", started, response.status_code, time.monotonic() - started)
        if response.status_code == 200:
            shown = {hit["recordId"] for hit in response.json()["results"]}
            answer.missing = len(self.stable.get(member, set()) - shown)
            answer.shown_gone = self._gone_before(started, shown)
        self.answers.append(answer)

    async def _read(self, member: int) -> None:
        started = time.monotonic()
        response = await self.cores.request(
            "GET", "/api/v1/records", member=member, params={"limit": 100}
        )
        answer = Answer("read", started, response.status_code, time.monotonic() - started)
        if response.status_code == 200:
            records = {r["recordId"]: r for r in response.json()["records"]}
            stable = self.stable.get(member, set())
            answer.missing = len(stable - set(records))
            answer.unkeyworded = sum(not records[r]["keywords"] for r in stable & set(records))
            answer.shown_gone = self._gone_before(started, set(records))
        self.answers.append(answer)

    def _gone_before(self, started: float, shown: set[int]) -> int:
        return sum(self.gone.get(record, started) < started for record in shown)
