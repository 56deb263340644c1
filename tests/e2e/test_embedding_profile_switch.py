"""An embedding-profile switch side by side, with two core processes and workers of two
profiles as real processes (docs/operations.md "Switching the embedding profile"; §1 and §5
Deviations in docs/contract.md).

Profile A is the tests' production profile (``text-embedding-3-small``, 1536-d); profile B a
smaller model of the fake provider (``fake-small``, 256-d, stored 256-d). 300 notes of four
members are processed under A. While searches (about 5 a second) and list reads (about 3)
run through the core's client API, ``reembed start --profile B --rate 30`` backfills; midway
one B worker and one core process are killed (SIGKILL) and started again, and notes are
created, edited and deleted. Then ``done`` reaches ``total``; ``cutover`` (searches served by
B, finding every live note, also the new ones); ``rollback`` (back to A, nothing lost);
``start`` and ``cutover`` again; ``finish`` (A's vectors removed).

Every search and read answers 200 and shows every note it should (the notes untouched by the
test: each search finds them all, each read shows them with keywords), never one deleted
before it started; no deleted or replaced note keeps a live vector under either profile; the
backfill keeps to its rate within 10 % over its steady part. Prints its figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import httpx
import pytest
from sqlalchemy import text

from app.repository import keyword_preset
from tests.core.harness import bearer, make_member
from tests.e2e.observe import wait_until
from tests.e2e.processes import ServiceProcess, core_environment, run_command, worker_environment
from tests.worker.harness import PROFILE as PROFILE_A

pytestmark = [pytest.mark.processes, pytest.mark.timeout(360)]

MEMBERS = (1, 2, 3, 4)
NOTES = 300
RATE = 30  # contexts a second (reembed start --rate)
MODEL_A, MODEL_B, DIMENSION_B = "text-embedding-3-small", "fake-small", 256
PROFILE_B = f"openai-{MODEL_B}-{DIMENSION_B}-cosine-v1"
QUERY = "창가 자리 조용한 카페 찾기"
SEARCHES_PER_SECOND, READS_PER_SECOND = 5, 3
# Changes during the backfill, two rounds, by note index (each index is one record).
EDITED = (range(0, 6), range(6, 12))
RECORDS_DELETED = (range(12, 15), range(15, 18))
CONTEXTS_DELETED = (range(18, 21), range(21, 24))  # a second note is added, the first deleted
CREATED = (range(NOTES, NOTES + 6), range(NOTES + 6, NOTES + 12))
CREATED_AFTER_CUTOVER = range(NOTES + 12, NOTES + 16)
STABLE = range(24, NOTES)  # never changed: every answer must show them
# Clocks: a note waiting behind the first burst must not look stale to the rescan.
PENDING_EXPIRY_SECONDS = 10
PROCESSING_EXPIRY_SECONDS = 6

LIVE_CONTEXTS = text(
    "SELECT c.id FROM core.context AS c JOIN core.record AS r ON r.id = c.record_id "
    "WHERE c.deleted_at IS NULL AND r.deleted_at IS NULL ORDER BY c.id"
)
UNFINISHED = text(
    "SELECT count(*) FROM ai.context_ai_state WHERE context_id = ANY(CAST(:ids AS bigint[])) "
    "AND NOT (embedding_status = 'COMPLETED' AND keyword_status = 'COMPLETED')"
)
NOT_JUDGED_UNDER = text(
    "SELECT count(*) FROM ai.context_ai_state AS s "
    "LEFT JOIN ai.context_keyword_analysis AS a USING (context_id) "
    "WHERE s.context_id = ANY(CAST(:ids AS bigint[])) AND NOT (s.embedding_status = "
    "'COMPLETED' AND s.keyword_status = 'COMPLETED' AND a.embedding_profile = :profile)"
)
LIVE_VECTORS = text(
    "SELECT context_id, embedding_profile FROM ai.context_embedding "
    "WHERE NOT is_deleted AND context_id = ANY(CAST(:ids AS bigint[]))"
)
VECTORS_OF = text("SELECT count(*) FROM ai.context_embedding WHERE embedding_profile = :profile")
BACKFILLED_AT = text(
    "SELECT extract(epoch FROM updated_at) FROM ai.context_embedding_backfill "
    "WHERE embedding_profile = :profile AND status = 'COMPLETED' ORDER BY 1"
)
LEFT_OF_A = text(
    "SELECT (SELECT count(*) FROM ai.context_embedding WHERE embedding_profile = :a) "
    "+ (SELECT count(*) FROM ai.keyword_preset_embedding WHERE embedding_profile = :a) "
    "+ (SELECT count(*) FROM ai.context_embedding_backfill WHERE embedding_profile = :a)"
)
SWITCH_TABLES = text("TRUNCATE core.embedding_switch, ai.context_embedding_backfill")


def _note(index: int, version: str = "") -> str:
    return f"switch note {index}{version}: 창가 자리 조용하고 디저트가 맛있는 카페"


@pytest.fixture
async def no_switch(engine):
    """No switch row and no backfill rows before and after (the per-test TRUNCATE does not
    empty them, and a switch row would change the profile in use of later tests)."""
    async with engine.begin() as conn:
        await conn.execute(SWITCH_TABLES)
    yield
    async with engine.begin() as conn:
        await conn.execute(SWITCH_TABLES)


@dataclass
class Note:
    member: int
    record_id: int
    context_id: int


class Cores:
    """The core processes' client API as a load balancer offers it: requests go to the
    processes in turn; a process that cannot be reached (killed) is skipped, counted in
    ``failovers``. Only searches and reads are sent again after the request went out."""

    def __init__(self, processes: Sequence[ServiceProcess]) -> None:
        self._processes = processes
        self._turn = itertools.count()
        self._client = httpx.AsyncClient(timeout=30)
        self.failovers = 0

    async def request(self, method: str, path: str, *, member: int, **kwargs) -> httpx.Response:
        repeatable = method == "GET" or path == "/api/v1/search"
        for _ in range(200):
            process = self._processes[next(self._turn) % len(self._processes)]
            try:
                return await self._client.request(
                    method, process.base_url + path, headers=bearer(member), **kwargs
                )
            except httpx.TransportError as exc:
                if not repeatable and not isinstance(exc, httpx.ConnectError):
                    raise
                self.failovers += 1
                await asyncio.sleep(0.05)
        raise AssertionError(f"no core process answered {method} {path}")

    async def aclose(self) -> None:
        await self._client.aclose()


@dataclass
class Answer:
    """One search or read: started (monotonic), status, latency (s), the stable records it
    did not show, those shown without keywords, and records shown after their delete."""

    kind: str
    at: float
    status: int
    seconds: float
    missing: int = 0
    unkeyworded: int = 0
    shown_gone: int = 0


@dataclass
class Load:
    """Searches and list reads through the cores at a steady pace until ``stop``."""

    cores: Cores
    stable: dict[int, set[int]]
    gone: dict[int, float] = field(default_factory=dict)  # record -> its delete answered
    answers: list[Answer] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._paced(SEARCHES_PER_SECOND, self._search)),
            asyncio.create_task(self._paced(READS_PER_SECOND, self._read)),
        ]

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def _paced(self, per_second: float, one: Callable[[int], Awaitable[None]]) -> None:
        loop = asyncio.get_running_loop()
        in_flight: set[asyncio.Task[None]] = set()
        next_at = loop.time()
        for turn in itertools.count():
            if self._stop.is_set():
                break
            task = asyncio.create_task(one(MEMBERS[turn % len(MEMBERS)]))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
            next_at += 1 / per_second
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), max(next_at - loop.time(), 0))
        await asyncio.gather(*in_flight)

    async def _search(self, member: int) -> None:
        started = time.monotonic()
        response = await self.cores.request(
            "POST", "/api/v1/search", member=member, json={"query": QUERY, "limit": 100}
        )
        answer = Answer("search", started, response.status_code, time.monotonic() - started)
        if response.status_code == 200:
            shown = {hit["recordId"] for hit in response.json()["results"]}
            answer.missing = len(self.stable[member] - shown)
            answer.shown_gone = sum(self.gone.get(r, started) < started for r in shown)
        self.answers.append(answer)

    async def _read(self, member: int) -> None:
        started = time.monotonic()
        response = await self.cores.request(
            "GET", "/api/v1/records", member=member, params={"limit": 100}
        )
        answer = Answer("read", started, response.status_code, time.monotonic() - started)
        if response.status_code == 200:
            records = {r["recordId"]: r for r in response.json()["records"]}
            answer.missing = len(self.stable[member] - set(records))
            answer.unkeyworded = sum(
                not records[r]["keywords"] for r in self.stable[member] & set(records)
            )
            answer.shown_gone = sum(self.gone.get(r, started) < started for r in records)
        self.answers.append(answer)

    def of(self, kind: str, since: float = 0.0, until: float = float("inf")) -> list[Answer]:
        return [a for a in self.answers if a.kind == kind and since <= a.at < until]


@dataclass
class Switch:
    """``pinlog-core reembed ...`` commands and ``reembed status --json`` samples."""

    env: dict[str, str]
    t0: float = 0.0
    samples: list[tuple[float, dict]] = field(default_factory=list)

    async def run(self, *args: str) -> str:
        code, out, err = await run_command("core_service.cli", "reembed", *args, env=self.env)
        assert code == 0, f"reembed {' '.join(args)} exited {code}:\n{out}\n{err[-3000:]}"
        return out

    async def status(self) -> dict:
        status = json.loads(await self.run("status", "--json"))
        self.samples.append((time.monotonic() - self.t0, status))
        return status

    async def sample_until(self, stop: asyncio.Event, every: float = 2.0) -> None:
        while not stop.is_set():
            await self.status()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every)

    async def wait_ready(self, *, within: float) -> dict:
        """Until every live note has a vector of the profile being filled; the status."""
        last: dict = {}

        async def ready() -> bool:
            nonlocal last
            last = await self.status()
            return last["state"] in ("ready", "cut_over", "idle") and last["done"] == last["total"]

        await wait_until(ready, within=within, what="the backfill to cover every live note")
        return last


async def _ids(engine, statement, **params) -> list:
    async with engine.connect() as conn:
        return list((await conn.execute(statement, params)).all())


async def _scalar(engine, statement, **params) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(statement, params)).scalar_one())


async def _wait_zero(engine, statement, *, within: float, what: str, **params) -> None:
    async def zero() -> bool:
        return await _scalar(engine, statement, **params) == 0

    await wait_until(zero, within=within, what=what)


async def _create(cores: Cores, notes: dict[int, Note], indices: Sequence[int]) -> None:
    limit = asyncio.Semaphore(16)

    async def one(index: int) -> None:
        member = MEMBERS[index % len(MEMBERS)]
        body = {"externalPlaceId": f"place-{index}", "placeName": "카페", "body": _note(index)}
        async with limit:
            response = await cores.request("POST", "/api/v1/records", member=member, json=body)
        assert response.status_code == 201, response.text
        notes[index] = Note(member, response.json()["recordId"], response.json()["contextId"])

    await asyncio.gather(*(one(index) for index in indices))


async def _change(cores: Cores, notes: dict[int, Note], load: Load, round_: int) -> set[int]:
    """One round of edits, deletes and creates through the cores; the contexts it ended."""
    ended: set[int] = set()

    async def edit(index: int) -> None:
        note = notes[index]
        response = await cores.request(
            "PUT", f"/api/v1/contexts/{note.context_id}", member=note.member,
            json={"body": _note(index, " (고침)")},
        )  # fmt: skip
        assert response.status_code == 200, response.text
        ended.add(note.context_id)
        note.context_id = response.json()["contextId"]

    async def delete_record(index: int) -> None:
        note = notes.pop(index)
        path = f"/api/v1/records/{note.record_id}"
        response = await cores.request("DELETE", path, member=note.member)
        assert response.status_code == 204, response.text
        load.gone[note.record_id] = time.monotonic()
        ended.add(note.context_id)

    async def delete_context(index: int) -> None:
        note = notes[index]
        response = await cores.request(
            "POST", f"/api/v1/records/{note.record_id}/contexts", member=note.member,
            json={"body": _note(index, " (둘째)")},
        )  # fmt: skip
        assert response.status_code == 201, response.text
        added = response.json()["contextId"]
        path = f"/api/v1/contexts/{note.context_id}"
        response = await cores.request("DELETE", path, member=note.member)
        assert response.status_code == 204, response.text
        ended.add(note.context_id)
        note.context_id = added

    await asyncio.gather(
        *(edit(i) for i in EDITED[round_]),
        *(delete_record(i) for i in RECORDS_DELETED[round_]),
        *(delete_context(i) for i in CONTEXTS_DELETED[round_]),
        _create(cores, notes, CREATED[round_]),
    )
    return ended


def _batches(times: Sequence[float], gap: float = 0.4) -> list[tuple[float, int]]:
    """Completion times (s) grouped into batches, a new one after a pause of ``gap`` s:
    (first completion, size)."""
    batches: list[list[float]] = []
    for i, at in enumerate(times):
        if i == 0 or at - times[i - 1] >= gap:
            batches.append([at, 0])
        batches[-1][1] += 1
    return [(start, int(size)) for start, size in batches]


def _steady_rate(batches: Sequence[tuple[float, int]], *, kill: float) -> tuple[float, float, int]:
    """Contexts a second over the backfill's steady part: runs of batches at most 2 s apart,
    each of at least half a batch (a smaller one is the backlog running out), split where the
    processes were killed (``kill``, epoch seconds); each run without its first batch (it may
    carry the pace's one second of credit). The least-squares slope of the contexts completed
    (at each batch's middle) against time, one intercept per run.
    (rate, seconds measured, contexts measured)."""
    runs: list[list[tuple[float, int]]] = [[]]
    for start, size in batches:
        run = runs[-1]
        if run and (start - run[-1][0] > 2.0 or size < RATE // 2 or run[-1][0] < kill <= start):
            runs.append([])
        if size >= RATE // 2:
            runs[-1].append((start, size))
    covariance = variance = seconds = 0.0
    contexts = 0
    for run in (run[1:] for run in runs if len(run) >= 3):
        times = [start for start, _ in run]
        done = list(itertools.accumulate(size for _, size in run))
        middles = [total - size / 2 for total, (_, size) in zip(done, run, strict=True)]
        t_mean, y_mean = statistics.fmean(times), statistics.fmean(middles)
        covariance += sum((t - t_mean) * (y - y_mean) for t, y in zip(times, middles, strict=True))
        variance += sum((t - t_mean) ** 2 for t in times)
        seconds += times[-1] - times[0]
        contexts += done[-1]
    return (covariance / variance if variance else 0.0), seconds, contexts


def _query_models(requests: Sequence[dict]) -> list[str]:
    return [r["model"] for r in requests if QUERY in r["input"]]


def _p99(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0


async def _search_all(cores: Cores, notes: dict[int, Note]) -> None:
    """Each member's search finds every live record of theirs."""
    for member in MEMBERS:
        response = await cores.request(
            "POST", "/api/v1/search", member=member, json={"query": QUERY, "limit": 100}
        )
        assert response.status_code == 200, response.text
        shown = {hit["recordId"] for hit in response.json()["results"]}
        assert shown == {n.record_id for n in notes.values() if n.member == member}


async def test_switch_side_by_side_under_load_with_kills_cutover_rollback_and_finish(
    engine, migrated_database, bundled_preset_rows, fake_openai, no_switch, tmp_path
):
    started = time.monotonic()
    fake_openai.set_model_dimension(MODEL_B, DIMENSION_B)
    async with engine.begin() as conn:
        await keyword_preset.upsert_all(conn, bundled_preset_rows)
    for member_id in MEMBERS:
        await make_member(engine, member_id)
    common = {
        # Every preset a candidate: each judgment selects one (the fake judge's first).
        "keyword_similarity_floor": -1,
        "processing_expiry_seconds": PROCESSING_EXPIRY_SECONDS,
        "database_pool_size": 6,
    }
    env_a = worker_environment(migrated_database, fake_openai, worker_concurrency=16, **common)
    env_b = worker_environment(
        migrated_database, fake_openai, embedding_model=MODEL_B,
        embedding_dimension=DIMENSION_B, vector_dimension=DIMENSION_B,
        embedding_profile=PROFILE_B, **common,
    )  # fmt: skip
    code, out, err = await run_command("app.cli", "presets", "load", env=env_b)
    assert code == 0, f"{out}\n{err[-3000:]}"
    worker_a = ServiceProcess("app", env_a, tmp_path / "worker-a.log")
    workers_b = [ServiceProcess("app", env_b, tmp_path / f"worker-b{i}.log") for i in range(2)]
    urls = ",".join(w.base_url for w in (worker_a, *workers_b))
    core_env = core_environment(
        migrated_database, urls,
        pending_expiry_seconds=PENDING_EXPIRY_SECONDS,
        processing_expiry_seconds=PROCESSING_EXPIRY_SECONDS,
        # No cut: every record of the member is a result (limit 100 > records per member).
        search_similarity_floor=0, search_similarity_floor_word=0, search_top_ratio=0,
        database_pool_size=8,
    )  # fmt: skip
    cores_ = [ServiceProcess("core_service", core_env, tmp_path / f"core{i}.log") for i in (0, 1)]
    processes = [worker_a, *workers_b, *cores_]
    cores = Cores(cores_)
    switch = Switch(core_env)
    notes: dict[int, Note] = {}
    load = Load(cores, {})
    sampling = asyncio.Event()
    sampler: asyncio.Task[None] | None = None
    try:
        await asyncio.gather(*(w.start() for w in (worker_a, *workers_b)))
        await asyncio.gather(*(c.start() for c in cores_))
        await _create(cores, notes, range(NOTES))
        await _wait_zero(
            engine, UNFINISHED, ids=[n.context_id for n in notes.values()], within=90,
            what="the 300 notes processed under A",
        )  # fmt: skip
        processed_at = time.monotonic()
        load.stable.update(
            {m: {notes[i].record_id for i in STABLE if notes[i].member == m} for m in MEMBERS}
        )
        load.start()
        await _more_answers(load, "search", 1)
        await _more_answers(load, "read", 1)

        # The backfill, with changes, a killed B worker and a killed core process.
        marks = {"start": len(fake_openai.embedding_requests)}
        switch.t0 = switch_started = time.monotonic()
        switch_started_at = time.time()
        await switch.run("start", "--profile", PROFILE_B, "--rate", str(RATE))
        sampler = asyncio.create_task(switch.sample_until(sampling))
        ended = set()
        await _wait_vectors(engine, PROFILE_B, at_least=60)
        ended |= await _change(cores, notes, load, 0)
        await _wait_vectors(engine, PROFILE_B, at_least=150)
        killed, killed_at = time.monotonic(), time.time()
        await asyncio.gather(workers_b[0].kill(), cores_[0].kill())
        await asyncio.gather(workers_b[0].start(), cores_[0].start())
        restarted = time.monotonic()
        ended |= await _change(cores, notes, load, 1)
        ready = await switch.wait_ready(within=90)
        backfilled, live_at_ready = time.monotonic(), len(notes)
        marks["ready"] = len(fake_openai.embedding_requests)
        completed_at = [
            float(row[0]) for row in await _ids(engine, BACKFILLED_AT, profile=PROFILE_B)
        ]

        # Cutover: searches served by B, every live note found.
        await switch.run("cutover", "--wait", "60")
        cut_over = time.monotonic()
        marks["cutover"] = len(fake_openai.embedding_requests)
        live = [n.context_id for n in notes.values()]
        await _wait_zero(
            engine, NOT_JUDGED_UNDER, ids=live, profile=PROFILE_B, within=60,
            what="every note judged again under B",
        )  # fmt: skip
        await _search_all(cores, notes)
        await _more_answers(load)
        after_cutover = _query_models(fake_openai.embedding_requests[marks["cutover"] :])
        vectors_after_cutover = await _ids(engine, LIVE_VECTORS, ids=sorted(ended))

        # Notes created under B are embedded under A too; rollback loses nothing.
        await _create(cores, notes, CREATED_AFTER_CUTOVER)
        live = [n.context_id for n in notes.values()]
        await _wait_zero(engine, UNFINISHED, ids=live, within=30, what="the new notes")
        await switch.wait_ready(within=60)
        await switch.run("rollback", "--wait", "60")
        marks["rollback"] = len(fake_openai.embedding_requests)
        await _wait_zero(
            engine, NOT_JUDGED_UNDER, ids=live, profile=PROFILE_A, within=60,
            what="every note judged again under A",
        )  # fmt: skip
        a_vectors = {
            row[0] for row in await _ids(engine, LIVE_VECTORS, ids=live) if row[1] == PROFILE_A
        }
        await _search_all(cores, notes)
        await _more_answers(load)
        after_rollback = _query_models(fake_openai.embedding_requests[marks["rollback"] :])

        # Again, to the end: A's vectors removed.
        await switch.run("start", "--profile", PROFILE_B, "--rate", str(RATE))
        await switch.wait_ready(within=60)
        await switch.run("cutover", "--wait", "60")
        await _wait_zero(
            engine, NOT_JUDGED_UNDER, ids=live, profile=PROFILE_B, within=60,
            what="every note judged again under B (second cutover)",
        )  # fmt: skip
        finish_out = await switch.run("finish")
        finished = time.monotonic()
        final = await switch.status()
        await _search_all(cores, notes)
        await _more_answers(load)
        await load.stop()
        sampling.set()
        await sampler
        live_in_db = [row[0] for row in await _ids(engine, LIVE_CONTEXTS)]
        vectors_at_end = await _ids(engine, LIVE_VECTORS, ids=sorted(ended | set(live)))
        left_of_a = await _scalar(engine, LEFT_OF_A, a=PROFILE_A)
    finally:
        sampling.set()
        if sampler is not None:
            await asyncio.gather(sampler, return_exceptions=True)
        await load.stop()
        await cores.aclose()
        await asyncio.gather(*(p.stop() for p in processes))

    requests = fake_openai.embedding_requests
    backfill_requests = [
        r for r in requests[marks["start"] : marks["ready"]] if r["model"] == MODEL_B
    ]
    during = [a for a in load.answers if switch_started <= a.at < finished]
    searches = load.of("search", switch_started, finished)
    failures = [(a.kind, a.status) for a in load.answers if a.status != 200]
    incomplete = [a for a in load.answers if a.missing or a.unkeyworded or a.shown_gone]
    batches = _batches(completed_at)
    rate, measured_seconds, measured = _steady_rate(batches, kill=killed_at)

    assert failures == []
    assert incomplete == []
    assert ready["failed"] == {} and ready["done"] == ready["total"] == live_at_ready
    assert sorted(live_in_db) == sorted(n.context_id for n in notes.values())
    # Searches after the cutover were served by B's workers, after the rollback by A's.
    assert after_cutover and set(after_cutover) == {MODEL_B}
    assert after_rollback and set(after_rollback) == {MODEL_A}
    # Deleted and replaced notes: no live vector under either profile, ever.
    assert vectors_after_cutover == []
    assert [row for row in vectors_at_end if row[0] in ended] == []
    assert a_vectors == set(live)  # the rollback lost nothing
    # After finish: B only, every live note once.
    assert left_of_a == 0
    assert sorted(row[0] for row in vectors_at_end if row[1] == PROFILE_B) == sorted(live)
    assert final["state"] == "idle" and final["profile_in_use"] == PROFILE_B
    assert set(final["vectors"]) == {PROFILE_B}
    assert measured_seconds >= 4, batches
    assert abs(rate - RATE) <= 0.1 * RATE, (rate, batches)

    coverage = "; ".join(
        f"{t:.0f}s {s['state']} {s['done']}/{s['total']}" for t, s in switch.samples
    )
    print(
        f"\nembedding-profile switch {PROFILE_A} -> {PROFILE_B}: {NOTES} notes processed under "
        f"A in {processed_at - started:.1f} s; backfill at --rate {RATE}: done {ready['done']}/"
        f"{ready['total']} after {backfilled - switch_started:.1f} s (one B worker and one core "
        f"process killed at {killed - switch_started:.1f} s, "
        f"back {restarted - killed:.1f} s later); steady rate {rate:.1f}/s over "
        f"{measured_seconds:.1f} s ({measured} contexts, {len(batches)} batches); provider "
        f"embedding calls for the backfill {len(backfill_requests)} for "
        f"{sum(len(r['input']) for r in backfill_requests)} inputs; cutover "
        f"{cut_over - backfilled:.1f} s (with re-judging); whole switch to finish "
        f"{finished - switch_started:.1f} s; {len(searches)} searches during the switch, p99 "
        f"{_p99([a.seconds for a in searches]) * 1000:.0f} ms; {len(during)} answers in all, "
        f"all 200 and complete; {cores.failovers} requests moved to the other core; whole test "
        f"{time.monotonic() - started:.1f} s"
    )
    print(f"coverage (reembed status --json): {coverage}")
    timeline = " ".join(f"{start - switch_started_at:.1f}s:{size}" for start, size in batches)
    print(f"backfill batches completed (s after start: contexts): {timeline}")
    print(finish_out.rstrip())


async def _more_answers(load: Load, kind: str = "search", count: int = 5) -> None:
    """Until the loop has had ``count`` more answers of ``kind`` (started from now on)."""
    since = time.monotonic()

    async def enough() -> bool:
        return len(load.of(kind, since)) >= count

    await wait_until(enough, within=20, what=f"{count} more answers of {kind}")


async def _wait_vectors(engine, profile: str, *, at_least: int) -> None:
    async def enough() -> bool:
        return await _scalar(engine, VECTORS_OF, profile=profile) >= at_least

    await wait_until(enough, within=60, what=f"{at_least} vectors of {profile}")
