"""A preset reclassification of 300 contexts with both services and two workers as real
processes (docs/operations.md "Reclassifying presets"; §4 and §9 Deviations).

300 notes, one per record, are judged with the bundled list (version 1). A new list keeps every
preset active and adds three (``pinlog-ai presets load``, version 2); the workers pick it up by
themselves; ``pinlog-core reprocess keywords`` waits for both, then resets and dispatches, and
the new judgments pick other keywords. Four readers poll every member's list of records
through the core's client API the whole time.
Every read shows each record's previous keywords or its new ones, never none; every context
ends judged with list 2; none is judged twice (one judge call and one keyword claim each), and
no note is embedded again. Prints its figures."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
import yaml
from sqlalchemy import text

from app.repository import keyword_preset
from app.service.preset_loader import DEFAULT_PRESET_FILE
from tests.core.harness import bearer, make_member
from tests.e2e.observe import wait_until
from tests.e2e.processes import (
    ServiceProcess,
    core_environment,
    run_command,
    worker_environment,
)

WAIT_SECONDS = 180

MEMBERS = (1, 2, 3)
NOTES_PER_MEMBER = 100  # one page of the member's list (the API's largest)
RATE = 100  # contexts reset a second
READERS = 4
MARKER = re.compile(r"reclassify note (\d+)")
# Generous clocks: a note waiting behind the burst must never look stale to the rescan.
PENDING_EXPIRY_SECONDS = 20
PROCESSING_EXPIRY_SECONDS = 6
JUDGMENTS = text(
    "SELECT s.context_id, s.embedding_status, s.keyword_status, s.keyword_attempt, "
    "a.preset_version FROM ai.context_ai_state s "
    "LEFT JOIN ai.context_keyword_analysis a USING (context_id) ORDER BY s.context_id"
)


def _note(index: int) -> str:
    return f"reclassify note {index}: 창가 자리 조용하고 디저트가 맛있는 카페"


def _new_list_file(directory: Path) -> Path:
    """The bundled list, every preset kept as it is, three presets added."""
    data = yaml.safe_load(DEFAULT_PRESET_FILE.read_text(encoding="utf-8"))
    for offset, source in enumerate(data["presets"][:3]):
        added = dict(source)
        added.update(id=900 + offset, code=f"ADDED_{offset}", display_name=f"새 프리셋 {offset}")
        added["description"] = f"{source['description']} (새 목록)"
        data["presets"].append(added)
    path = directory / "presets-v2.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return path


async def _judgments(engine) -> list[tuple]:
    async with engine.connect() as conn:
        return [tuple(row) for row in await conn.execute(JUDGMENTS)]


class Readers:
    """Poll every member's list of records until stopped; remember each record's keyword
    sets and every read that showed none."""

    def __init__(self, base_url: str) -> None:
        self._base_url = base_url
        self.stop = asyncio.Event()
        self.reads = 0
        self.failures: list[int] = []
        self.empty: list[tuple[int, float]] = []  # (record, when)
        self.seen: dict[int, set[frozenset[str]]] = {}

    async def run(self, index: int) -> None:
        async with httpx.AsyncClient(base_url=self._base_url, timeout=30) as client:
            turn = index
            while not self.stop.is_set():
                member = MEMBERS[turn % len(MEMBERS)]
                turn += 1
                response = await client.get(
                    "/api/v1/records", params={"limit": 100}, headers=bearer(member)
                )
                self.reads += 1
                if response.status_code != 200:
                    self.failures.append(response.status_code)
                    continue
                for record in response.json()["records"]:
                    codes = frozenset(keyword["code"] for keyword in record["keywords"])
                    if not codes:
                        self.empty.append((record["recordId"], time.monotonic()))
                    self.seen.setdefault(record["recordId"], set()).add(codes)


# 600 judgments through real processes: on a machine loaded by the parallel pass they take
# minutes, so the waits (hang detection, not a speed claim) and the test's timeout are long.
@pytest.mark.timeout(400)
async def test_300_contexts_are_judged_again_with_the_new_list_and_never_read_without_keywords(
    engine, migrated_database, bundled_preset_rows, fake_openai, tmp_path
):
    started = time.monotonic()
    async with engine.begin() as conn:
        await keyword_preset.upsert_all(conn, bundled_preset_rows)
    for member_id in MEMBERS:
        await make_member(engine, member_id)
    worker_env = worker_environment(
        migrated_database,
        fake_openai,
        # Every preset a candidate: each judgment selects one (the fake judge's first).
        keyword_similarity_floor=-1,
        presets_refresh_seconds=0.5,
        processing_expiry_seconds=PROCESSING_EXPIRY_SECONDS,
        database_pool_size=6,
    )
    workers = [ServiceProcess("app", worker_env, tmp_path / f"worker{i}.log") for i in range(2)]
    urls = ",".join(worker.base_url for worker in workers)
    core_env = core_environment(
        migrated_database,
        urls,
        pending_expiry_seconds=PENDING_EXPIRY_SECONDS,
        processing_expiry_seconds=PROCESSING_EXPIRY_SECONDS,
    )
    core = ServiceProcess("core_service", core_env, tmp_path / "core.log")
    readers = Readers(core.base_url)
    try:
        await asyncio.gather(*(process.start() for process in [*workers, core]))
        context_ids = await _create_notes(core.base_url)

        async def first_judgments_done() -> bool:
            rows = await _judgments(engine)
            return len(rows) == len(context_ids) and all(r[1:3] == ("COMPLETED",) * 2 for r in rows)

        await wait_until(first_judgments_done, within=WAIT_SECONDS, what="the first judgments")
        ready_at = time.monotonic()
        judged_before = len(fake_openai.judge_requests)
        embedded_before = len(fake_openai.embedding_requests)

        reading = [asyncio.create_task(readers.run(i)) for i in range(READERS)]
        await wait_until(lambda: _read_some(readers), what="the readers' first sweeps")
        code, out, err = await run_command(
            "app.cli", "presets", "load", "--file", str(_new_list_file(tmp_path)), env=worker_env
        )
        assert code == 0, err[-3000:]
        # The new judgments pick another candidate (the highest id), so that reads can tell
        # a record's new keywords from its previous ones.
        fake_openai.set_judge_selection(lambda ids: [(max(ids), 0.8)])
        reprocess_started = time.monotonic()
        code, out, err = await run_command(
            "core_service.cli", "reprocess", "keywords", "--rate", str(RATE), "--wait", "30",
            env=core_env,
        )  # fmt: skip
        assert code == 0, f"{out}\n{err[-3000:]}"
        command_done = time.monotonic()

        async def judged_again() -> bool:
            rows = await _judgments(engine)
            return all(r[2] == "COMPLETED" and r[4] == 2 for r in rows)

        await wait_until(judged_again, within=WAIT_SECONDS, what="every context judged with list 2")
        finished = time.monotonic()
        reads_so_far = readers.reads
        await wait_until(lambda: _read_some(readers, more_than=reads_so_far), what="a last sweep")
        readers.stop.set()
        await asyncio.gather(*reading)
        status_code, status_out, _ = await run_command(
            "core_service.cli", "status", "--json", env=core_env
        )
    finally:
        readers.stop.set()
        await asyncio.gather(*(process.stop() for process in [core, *workers]))

    rows = await _judgments(engine)
    judged = Counter(
        int(match.group(1))
        for request in fake_openai.judge_requests[judged_before:]
        for match in MARKER.finditer(json.dumps(request, ensure_ascii=False))
    )
    notes_embedded = [
        text_
        for request in fake_openai.embedding_requests[embedded_before:]
        for text_ in request["input"]
        if MARKER.search(text_)
    ]
    status = json.loads(status_out)
    assert "every worker is on preset list version 2" in out
    assert readers.failures == []
    assert readers.empty == []
    assert len(readers.seen) == len(context_ids)
    # Every context: COMPLETED with list 2, claimed for keywords exactly twice in its life
    # (its first judgment and its one re-judgment), judged once more at the provider.
    assert [row[0] for row in rows] == sorted(context_ids)
    assert {row[1:] for row in rows} == {("COMPLETED", "COMPLETED", 2, 2)}
    assert judged == dict.fromkeys(range(len(context_ids)), 1)
    assert notes_embedded == []  # the stored vectors were reused (the new list was embedded)
    assert status_code == 0
    assert status["reprocess"] == {
        "pending": 0, "processing": 0, "failed": 0, "failed_context_ids": [],
    }  # fmt: skip
    assert status["backlog"] == 0
    changed = sum(len(sets) > 1 for sets in readers.seen.values())
    assert changed > 0  # the readers did watch records move from one set to the other
    print(
        f"\npreset reclassification: {len(context_ids)} contexts, 2 workers; first judgments "
        f"{ready_at - started:.1f} s after start; reprocess command "
        f"{command_done - reprocess_started:.1f} s "
        f"(--rate {RATE}), all judged with list 2 after {finished - reprocess_started:.1f} s; "
        f"{readers.reads} list reads by {READERS} readers, 0 without keywords; "
        f"{changed} records read with both their old and new keywords; judge calls "
        f"{sum(judged.values())}, embedding calls 0; whole test {time.monotonic() - started:.1f} s"
    )
    print(out.rstrip())


async def _read_some(readers: Readers, *, more_than: int = READERS) -> bool:
    return readers.reads > more_than


async def _create_notes(base_url: str) -> list[int]:
    """300 notes through the client API, one record each, 16 at a time."""
    limit = asyncio.Semaphore(16)
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:

        async def one(index: int) -> int:
            member = MEMBERS[index % len(MEMBERS)]
            body = {"externalPlaceId": f"place-{index}", "placeName": "카페", "body": _note(index)}
            async with limit:
                response = await client.post("/api/v1/records", json=body, headers=bearer(member))
            assert response.status_code == 201, response.text
            return response.json()["contextId"]

        return list(await asyncio.gather(*(one(i) for i in range(NOTES_PER_MEMBER * len(MEMBERS)))))
