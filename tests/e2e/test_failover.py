"""Failover without a restart (docs/deployment.md "Failover: a database that moves"): both
services run as processes on a primary and two streaming standbys (``tests/replication.py``),
their URLs naming all three hosts with ``target_session_attrs=read-write``; a client creates
notes through the core's API without pause while the primary stops and a standby is promoted.

Two runs, in file order, on the same processes (which are never restarted):

1. the primary stops with ``pg_ctl stop -m fast`` (its shutdown ships every WAL record to the
   standbys) and the first standby is promoted; the second standby then follows it;
2. with ``synchronous_standby_names`` set on the new primary (a commit returns only once the
   remaining standby has it), the new primary crashes (``pg_ctl stop -m immediate``) and the
   last standby is promoted.

Asserted in each run:

- every create is answered within its deadline (the core's request deadline plus a margin for
  the answer to travel), created (201) or refused (503), nothing in between;
- ``/readyz`` of both services tells the truth: it turns 503 once the primary is gone, stays so
  until the standby is promoted, and is 200 again within 30 s of the promotion;
- no committed note is lost: every note the client was told was created exists on the new
  primary and ends ``COMPLETED`` (the rescan re-requests what the failover interrupted), and
  so does any note whose create was refused after all.

The figures of each run (recovery per service, notes created before, during and after, notes
lost) are printed (``-s``) and recorded in docs/deployment.md.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx
import pytest
from sqlalchemy import text

from app.repository import keyword_preset
from app.repository.db import create_engine
from tests.core.harness import bearer, make_member
from tests.e2e.processes import ServiceProcess, core_environment, worker_environment
from tests.replication import Node, ReplicatedCluster

MEMBER = 1
# The core's request deadline in these runs (seconds); an answer may take a little longer to
# arrive on this loaded machine, never more than this margin.
REQUEST_TIMEOUT_SECONDS = 5.0
ANSWER_MARGIN_SECONDS = 3.0
# The bound for reconnecting without a restart.
RECOVERY_BOUND_SECONDS = 30.0
# Creates before the primary stops and after both services are ready again.
NOTES_BEFORE = 12
NOTES_AFTER = 12
CREATE_GAP_SECONDS = 0.03
READYZ_POLL_SECONDS = 0.05
BODIES = (
    "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음.",
    "친구들이랑 수다 떨기 좋은 넓은 술집. 단체석 있음.",
    "아이와 함께 가기 좋은 넓은 공원. 놀이터 있음.",
    "비 오는 날 창가 자리에서 작업했어요. 빗소리 최고.",
)


@dataclass
class Create:
    started: float
    finished: float
    status: int | None  # None: no answer at all
    context_id: int | None


@dataclass
class Readyz:
    asked: float
    answered: float
    status: int | None


@dataclass
class Run:
    creates: list[Create] = field(default_factory=list)
    readyz: dict[str, list[Readyz]] = field(default_factory=lambda: {"core": [], "worker": []})
    stopping: float = 0.0
    stopped: float = 0.0
    promoting: float = 0.0
    promoted: float = 0.0


@dataclass
class Setup:
    cluster: ReplicatedCluster
    worker: ServiceProcess
    core: ServiceProcess


@pytest.fixture(scope="module")
async def setup(bundled_preset_rows, fake_openai_server, tmp_path_factory):
    """A primary, two standbys and both services on all three (started once for both runs)."""
    logs = tmp_path_factory.mktemp("failover-logs")
    cluster = await ReplicatedCluster.create(standbys=2)
    try:
        engine = create_engine(cluster.primary.url(), pool_size=1)
        try:
            async with engine.begin() as conn:  # the worker caches presets at startup (§4)
                await keyword_preset.upsert_all(conn, bundled_preset_rows)
            await make_member(engine, MEMBER)
        finally:
            await engine.dispose()
        url = cluster.failover_url()
        worker = ServiceProcess("app", worker_environment(url, fake_openai_server), logs / "w.log")
        core = ServiceProcess(
            "core_service",
            core_environment(
                url,
                worker.base_url,
                rescan_period_seconds=1,
                request_timeout_seconds=REQUEST_TIMEOUT_SECONDS,
            ),
            logs / "core.log",
        )
        try:
            await asyncio.gather(worker.start(), core.start())
            yield Setup(cluster, worker, core)
        finally:
            await asyncio.gather(core.stop(), worker.stop())
    finally:
        await cluster.close()


async def _create_stream(
    client: httpx.AsyncClient, run: Run, stop: asyncio.Event, tag: str
) -> None:
    """Create notes one after another (each at a place of its own) until ``stop``."""
    n = 0
    while not stop.is_set():
        body = f"{BODIES[n % len(BODIES)]} #{n}"
        started = time.monotonic()
        try:
            response = await client.post(
                "/api/v1/records",
                json={"externalPlaceId": f"{tag}-{n}", "placeName": "카페", "body": body},
                headers=bearer(MEMBER),
            )
            status = response.status_code
            context_id = response.json().get("contextId") if status in (200, 201) else None
        except httpx.TransportError:
            status, context_id = None, None
        run.creates.append(Create(started, time.monotonic(), status, context_id))
        n += 1
        await asyncio.sleep(CREATE_GAP_SECONDS)


async def _watch_readyz(
    client: httpx.AsyncClient, answers: list[Readyz], stop: asyncio.Event
) -> None:
    while not stop.is_set():
        asked = time.monotonic()
        try:
            status = (await client.get("/readyz")).status_code
        except httpx.TransportError:
            status = None
        answers.append(Readyz(asked, time.monotonic(), status))
        await asyncio.sleep(READYZ_POLL_SECONDS)


async def _until(condition, what: str, within: float = RECOVERY_BOUND_SECONDS) -> None:
    try:
        async with asyncio.timeout(within):
            while not condition():  # noqa: ASYNC110 (the tasks fill the lists being read)
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not within {within} s: {what}") from None


def _ready_since(answers: list[Readyz], since: float) -> bool:
    return any(a.asked >= since and a.status == 200 for a in answers)


def _created_since(run: Run, since: float) -> int:
    return sum(1 for c in run.creates if c.started >= since and c.status == 201)


async def _final_states(url: str) -> dict[int, tuple[str, str]]:
    engine = create_engine(url, pool_size=1)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                text(
                    "SELECT c.id, s.embedding_status, s.keyword_status FROM core.context AS c "
                    "JOIN ai.context_ai_state AS s ON s.context_id = c.id"
                )
            )
            return {row.id: (row.embedding_status, row.keyword_status) for row in rows}
    finally:
        await engine.dispose()


async def _fail_over(services: Setup, old: Node, new: Node, mode: str) -> None:
    """One run (module docstring): creates all along, ``old`` stopped with ``mode``, ``new``
    promoted; the assertions, and the figures printed."""
    run = Run()
    stop = asyncio.Event()
    async with (
        httpx.AsyncClient(base_url=services.core.base_url, timeout=30) as client,
        httpx.AsyncClient(base_url=services.core.base_url, timeout=30) as core_probe,
        httpx.AsyncClient(base_url=services.worker.base_url, timeout=30) as worker_probe,
    ):
        tasks = [
            asyncio.create_task(_create_stream(client, run, stop, mode)),
            asyncio.create_task(_watch_readyz(core_probe, run.readyz["core"], stop)),
            asyncio.create_task(_watch_readyz(worker_probe, run.readyz["worker"], stop)),
        ]
        try:
            await _until(lambda: _created_since(run, 0) >= NOTES_BEFORE, "creates before")
            run.stopping = time.monotonic()
            await old.stop(mode)
            run.stopped = time.monotonic()
            # The truth: both services say they are not ready while no server takes writes.
            for name in ("core", "worker"):
                await _until(
                    lambda n=name: any(
                        a.asked >= run.stopped and a.status == 503 for a in run.readyz[n]
                    ),
                    f"{name} /readyz turning 503 after the primary stopped",
                )
            run.promoting = time.monotonic()
            await new.promote()
            run.promoted = time.monotonic()
            for name in ("core", "worker"):
                await _until(
                    lambda n=name: _ready_since(run.readyz[n], run.promoted),
                    f"{name} /readyz 200 after the promotion",
                )
            recovered = time.monotonic()
            await _until(
                lambda: _created_since(run, recovered) >= NOTES_AFTER, "creates after recovery"
            )
        finally:
            stop.set()
            await asyncio.gather(*tasks)

    # Every answer within the deadline: created or refused, nothing else, no hang.
    for create in run.creates:
        assert create.status in (201, 503), create
        assert create.finished - create.started <= REQUEST_TIMEOUT_SECONDS + ANSWER_MARGIN_SECONDS
    # /readyz: no 200 computed after the services had seen the primary gone and before the
    # promotion (the worker reuses a check for up to 1 s: its first 503 marks the start).
    for name, answers in run.readyz.items():
        first_down = min(a.asked for a in answers if a.asked >= run.stopped and a.status == 503)
        lying = [a for a in answers if first_down <= a.asked and a.answered < run.promoting]
        assert all(a.status == 503 for a in lying), (name, [a.status for a in lying])
        assert all(a.status is not None for a in answers), f"{name} stopped answering"

    created = [c.context_id for c in run.creates if c.status == 201]
    new_primary = new.url()

    async def every_note_completed() -> dict[int, tuple[str, str]]:
        async with asyncio.timeout(RECOVERY_BOUND_SECONDS):
            while True:
                states = await _final_states(new_primary)
                if set(created) <= set(states) and all(
                    s == ("COMPLETED", "COMPLETED") for s in states.values()
                ):
                    return states
                await asyncio.sleep(0.2)

    try:
        states = await every_note_completed()
    except TimeoutError:
        states = await _final_states(new_primary)
    lost = [context_id for context_id in created if context_id not in states]
    unfinished = {i: s for i, s in states.items() if s != ("COMPLETED", "COMPLETED")}
    before = sum(1 for c in run.creates if c.status == 201 and c.started < run.stopping)
    during = sum(
        1 for c in run.creates if c.status == 201 and run.stopping <= c.started < recovered
    )
    after = len(created) - before - during
    print(
        f"\nfailover ({mode}): core ready {_first_ready(run, 'core'):.2f} s and worker ready "
        f"{_first_ready(run, 'worker'):.2f} s after the promotion (promote took "
        f"{run.promoted - run.promoting:.2f} s; the primary was down "
        f"{run.promoted - run.stopped:.2f} s before it); notes created {len(created)} "
        f"(before {before}, during {during}, after {after}), refused "
        f"{sum(1 for c in run.creates if c.status == 503)}, "
        f"notes on the new primary {len(states)}, "
        f"lost {len(lost)}, unfinished {len(unfinished)}"
    )
    assert lost == []
    assert unfinished == {}
    assert len(states) >= len(created)


async def test_1_a_primary_stopped_fast_loses_nothing(setup: Setup):
    cluster = setup.cluster
    primary, first, second = cluster.nodes
    await _fail_over(setup, primary, first, "fast")
    # The second standby follows the new primary, for the next run.
    await cluster.follow(second, first)
    await cluster.wait_streaming(first, standbys=1)


async def test_2_a_crashed_primary_with_a_synchronous_standby_loses_nothing(setup: Setup):
    cluster = setup.cluster
    _, first, second = cluster.nodes
    await cluster.wait_streaming(first, standbys=1)
    await cluster.set_synchronous(first)
    await cluster.wait_streaming(first, standbys=1)
    await _fail_over(setup, first, second, "immediate")


def _first_ready(run: Run, name: str) -> float:
    return min(
        a.answered for a in run.readyz[name] if a.asked >= run.promoted and a.status == 200
    ) - (run.promoted)
