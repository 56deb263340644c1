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
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from sqlalchemy import text

from app.repository import keyword_preset
from tests.core.harness import make_member
from tests.e2e.client_load import ClientLoad, Cores
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
# Changes, by note index (one record each): round 0 while the backlog runs, on notes the
# backfill has not reached yet (it goes in id order); round 1 after the kills, on notes it
# embedded first. A deleted context's record gets a second note first (the last one cannot go).
EDITED = (range(276, 282), range(0, 6))
RECORDS_DELETED = (range(282, 285), range(6, 9))
CONTEXTS_DELETED = (range(285, 288), range(9, 12))
CREATED = (range(NOTES, NOTES + 6), range(NOTES + 6, NOTES + 12))
CREATED_AFTER_CUTOVER = range(NOTES + 12, NOTES + 16)
CHANGED = frozenset(i for group in (*EDITED, *RECORDS_DELETED, *CONTEXTS_DELETED) for i in group)
STABLE = [i for i in range(NOTES) if i not in CHANGED]  # every answer must show them
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
# The contexts the backfill embedded under :profile (stored, or discarded at the save
# because the note was deleted meanwhile): when the batch was sent that embedded each, and
# when it was settled (epoch seconds). A row the core closed CANCELLED without sending it (its
# note was gone before its turn: no requested_at) was never part of the pace.
BACKFILLED = text(
    "SELECT extract(epoch FROM requested_at), extract(epoch FROM updated_at) "
    "FROM ai.context_embedding_backfill "
    "WHERE embedding_profile = :profile AND status IN ('COMPLETED', 'CANCELLED') "
    "AND requested_at IS NOT NULL ORDER BY 1"
)
# Backfill rows of :profile claimed more than once (a worker died holding them, or a batch
# was sent again).
CLAIMED_AGAIN = text(
    "SELECT count(*) FROM ai.context_embedding_backfill "
    "WHERE embedding_profile = :profile AND attempt > 1"
)
LEFT_OF_A = text(
    "SELECT (SELECT count(*) FROM ai.context_embedding WHERE embedding_profile = :a) "
    "+ (SELECT count(*) FROM ai.keyword_preset_embedding WHERE embedding_profile = :a) "
    "+ (SELECT count(*) FROM ai.context_embedding_backfill WHERE embedding_profile = :a)"
)


def _note(index: int, version: str = "") -> str:
    return f"switch note {index}{version}: 창가 자리 조용하고 디저트가 맛있는 카페"


@dataclass
class Note:
    member: int
    record_id: int
    context_id: int


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
        """Until every live note has a vector of the profile being filled (after a cutover,
        of both profiles: the one in use and the previous one); the status."""
        last: dict = {}

        async def ready() -> bool:
            nonlocal last
            last = await self.status()
            previous = last["previous_done"]
            return (
                last["state"] in ("ready", "cut_over")
                and last["done"] == last["total"]
                and (previous is None or previous == last["total"])
            )

        await wait_until(ready, within=within, what="the backfill to cover every live note")
        return last


async def _rows(engine, statement, **params) -> list:
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


async def _change(cores: Cores, notes: dict[int, Note], load: ClientLoad, round_: int) -> set[int]:
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
    """Sorted times (s) grouped into batches, a new one after a pause of ``gap`` s:
    (first time, size)."""
    batches: list[list[float]] = []
    for i, at in enumerate(times):
        if i == 0 or at - times[i - 1] >= gap:
            batches.append([at, 0])
        batches[-1][1] += 1
    return [(start, int(size)) for start, size in batches]


def _steady_rate(batches: Sequence[tuple[float, int]], *, kill: float) -> tuple[float, float, int]:
    """Contexts a second over the backfill's steady part: runs of full batches (``RATE``
    contexts or more: the pace's batch is ``RATE``, two may go together) at most 1.5 s apart
    (one batch a second: a longer pause is a slot that found nothing to send, the backlog
    running out, e.g. before the new notes are seeded); a smaller batch, a longer pause or
    the kill (``kill``, epoch seconds) ends a run. Each run without its first batch (it may
    carry the pace's one second of credit). The least-squares slope of the contexts embedded
    (at each batch's middle) against time, one intercept per run.
    (rate, seconds measured, contexts measured)."""
    runs: list[list[tuple[float, int]]] = [[]]
    for start, size in batches:
        run = runs[-1]
        if run and (start - run[-1][0] > 1.5 or size < RATE or run[-1][0] < kill <= start):
            runs.append([])
        if size >= RATE:
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


@pytest.mark.serial  # its own load, kills and a measured rate: alone, in the serial pass
async def test_switch_side_by_side_under_load_with_kills_cutover_rollback_and_finish(
    engine, migrated_database, bundled_preset_rows, fake_openai, tmp_path
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
    core_processes = [
        ServiceProcess("core_service", core_env, tmp_path / f"core{i}.log") for i in range(2)
    ]
    cores = Cores(core_processes)
    load = ClientLoad(cores, MEMBERS, QUERY, SEARCHES_PER_SECOND, READS_PER_SECOND)
    switch = Switch(core_env)
    notes: dict[int, Note] = {}
    ended: set[int] = set()  # contexts edited away or deleted
    sampling = asyncio.Event()
    sampler: asyncio.Task[None] | None = None
    try:
        await asyncio.gather(*(w.start() for w in (worker_a, *workers_b)))
        await asyncio.gather(*(c.start() for c in core_processes))
        await _create(cores, notes, range(NOTES))
        ids = [n.context_id for n in notes.values()]
        await _wait_zero(engine, UNFINISHED, ids=ids, within=90, what="the notes under A")
        processed = time.monotonic()
        for member in MEMBERS:
            load.stable[member] = {notes[i].record_id for i in STABLE if notes[i].member == member}
        load.start()
        await _more_answers(load, "search", 1)
        await _more_answers(load, "read", 1)

        # The backfill, with changes, a killed B worker and a killed core process.
        marks = {"start": len(fake_openai.embedding_requests)}
        switch.t0 = switch_started = time.monotonic()
        switch_started_at = time.time()
        await switch.run("start", "--profile", PROFILE_B, "--rate", str(RATE))
        sampler = asyncio.create_task(switch.sample_until(sampling))
        await _wait_vectors(engine, PROFILE_B, at_least=60)
        round_0 = (*EDITED[0], *RECORDS_DELETED[0], *CONTEXTS_DELETED[0])
        targets = [notes[i].context_id for i in round_0]
        not_yet_backfilled = len(targets) - len(
            [row for row in await _rows(engine, LIVE_VECTORS, ids=targets) if row[1] == PROFILE_B]
        )
        ended |= await _change(cores, notes, load, 0)
        await _wait_vectors(engine, PROFILE_B, at_least=NOTES // 2)
        await _next_batch_at_the_provider(fake_openai)  # kill while it is being saved
        killed, killed_at = time.monotonic(), time.time()
        await asyncio.gather(workers_b[0].kill(), core_processes[0].kill())
        await asyncio.gather(workers_b[0].start(), core_processes[0].start())
        restarted = time.monotonic()
        ended |= await _change(cores, notes, load, 1)
        ready = await switch.wait_ready(within=90)
        backfilled, live_at_ready = time.monotonic(), len(notes)
        marks["ready"] = len(fake_openai.embedding_requests)
        backfilled_rows = await _rows(engine, BACKFILLED, profile=PROFILE_B)
        reclaimed = await _scalar(engine, CLAIMED_AGAIN, profile=PROFILE_B)

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
        ended_vectors = await _rows(engine, LIVE_VECTORS, ids=sorted(ended))

        # Notes created under B get A vectors too; the rollback loses nothing.
        await _create(cores, notes, CREATED_AFTER_CUTOVER)
        live = [n.context_id for n in notes.values()]
        await _wait_zero(engine, UNFINISHED, ids=live, within=30, what="the notes under B")
        await switch.wait_ready(within=60)
        await switch.run("rollback", "--wait", "60")
        marks["rollback"] = len(fake_openai.embedding_requests)
        await _wait_zero(
            engine, NOT_JUDGED_UNDER, ids=live, profile=PROFILE_A, within=60,
            what="every note judged again under A",
        )  # fmt: skip
        vectors = await _rows(engine, LIVE_VECTORS, ids=live)
        a_vectors = sorted(row[0] for row in vectors if row[1] == PROFILE_A)
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
        live_in_db = [row[0] for row in await _rows(engine, LIVE_CONTEXTS)]
        vectors_at_end = await _rows(engine, LIVE_VECTORS, ids=sorted(ended | set(live)))
        left_of_a = await _scalar(engine, LEFT_OF_A, a=PROFILE_A)
    finally:
        sampling.set()
        if sampler is not None:
            await asyncio.gather(sampler, return_exceptions=True)
        await load.stop()
        await cores.aclose()
        await asyncio.gather(*(p.stop() for p in (*core_processes, worker_a, *workers_b)))

    requests = fake_openai.embedding_requests[marks["start"] : marks["ready"]]
    backfill_calls = _of_model_b(requests)
    searches = load.of("search", switch_started, finished)
    answers = [a for a in load.answers if switch_started <= a.at < finished]
    not_complete = [a for a in load.answers if not a.complete]
    # The pace: contexts embedded, at the time their batch was sent (the pace's own clock; a
    # batch lost with a killed process is sent again later and counted then); "saved": at
    # the time each was stored (or discarded).
    sent = sorted(float(at) for at, _ in backfilled_rows)
    saved = sorted(float(at) for _, at in backfilled_rows)
    rate, measured_seconds, measured = _steady_rate(_batches(sent), kill=killed_at)
    rate_by_save = _steady_rate(_batches(saved), kill=killed_at)[0]
    print(
        f"\nembedding-profile switch {PROFILE_A} -> {PROFILE_B}, {NOTES} notes (processed "
        f"under A in {processed - started:.1f} s); whole test {time.monotonic() - started:.1f} s"
    )
    print(
        f"backfill at --rate {RATE}: done {ready['done']}/{ready['total']} after "
        f"{backfilled - switch_started:.1f} s; steady rate {rate:.1f}/s over "
        f"{measured_seconds:.1f} s ({measured} contexts), by save time {rate_by_save:.1f}/s; "
        f"provider embedding calls for it {len(backfill_calls)} for "
        f"{sum(len(r['input']) for r in backfill_calls)} inputs (all embedding calls "
        f"meanwhile {len(requests)})"
    )
    print(
        f"one B worker and one core process killed at {killed - switch_started:.1f} s, back "
        f"{restarted - killed:.1f} s later; {reclaimed} contexts claimed again; "
        f"{not_yet_backfilled} notes changed before the backfill reached them"
    )
    print(
        f"cutover {cut_over - backfilled:.1f} s (with re-judging); start to finish "
        f"{finished - switch_started:.1f} s; {len(searches)} searches meanwhile, p99 "
        f"{_p99([a.seconds for a in searches]) * 1000:.0f} ms; {len(answers)} searches and "
        f"reads, {len(not_complete)} not 200 or incomplete; {cores.failovers} requests moved "
        f"to the other core process"
    )
    coverage = "; ".join(
        f"{t:.0f}s {s['state']} {s['done']}/{s['total']}" for t, s in switch.samples
    )
    print(f"coverage (reembed status --json, s after start): {coverage}")
    for name, times in (("sent", sent), ("saved", saved)):
        timeline = " ".join(f"{t - switch_started_at:.1f}:{n}" for t, n in _batches(times))
        print(f"backfill batches {name} (s after start:contexts): {timeline}")
    print(finish_out.rstrip())

    assert not_complete == []
    assert ready["failed"] == {} and ready["done"] == ready["total"] == live_at_ready
    assert sorted(live_in_db) == sorted(live)
    # Searches after the cutover were served by B's workers, after the rollback by A's.
    assert after_cutover and set(after_cutover) == {MODEL_B}
    assert after_rollback and set(after_rollback) == {MODEL_A}
    # Deleted and replaced notes: no live vector under either profile.
    assert ended_vectors == []
    assert [row for row in vectors_at_end if row[0] in ended] == []
    assert a_vectors == sorted(live)  # the rollback lost nothing
    # After finish: B only, every live note once.
    assert left_of_a == 0
    assert sorted(row[0] for row in vectors_at_end if row[1] == PROFILE_B) == sorted(live)
    assert final["state"] == "idle" and final["profile_in_use"] == PROFILE_B
    assert set(final["vectors"]) == {PROFILE_B}
    # Three full batches in a run at least (one a second; the kill, the seeding of new notes and
    # a loaded machine decide how long the steady part is: 2.0 to 4.0 s seen).
    assert measured_seconds >= 1.9
    assert abs(rate - RATE) <= 0.1 * RATE


async def _more_answers(load: ClientLoad, kind: str = "search", count: int = 5) -> None:
    """Until the loop has had ``count`` more answers of ``kind`` (started from now on)."""
    since = time.monotonic()

    async def enough() -> bool:
        return len(load.of(kind, since)) >= count

    await wait_until(enough, within=20, what=f"{count} more answers of {kind}")


async def _next_batch_at_the_provider(fake) -> None:
    """Until the next embedding request of model B arrives (polled every 10 ms)."""
    seen = len(_of_model_b(fake.embedding_requests))
    async with asyncio.timeout(10):
        while len(_of_model_b(fake.embedding_requests)) == seen:  # noqa: ASYNC110
            await asyncio.sleep(0.01)


def _of_model_b(requests: Sequence[dict]) -> list[dict]:
    return [r for r in requests if r["model"] == MODEL_B]


async def _wait_vectors(engine, profile: str, *, at_least: int) -> None:
    async def enough() -> bool:
        return await _scalar(engine, VECTORS_OF, profile=profile) >= at_least

    await wait_until(enough, within=60, what=f"{at_least} vectors of {profile}")
