"""``pinlog-core reprocess keywords`` as a real command (docs/operations.md "Reclassifying
presets"): against a real worker (fake OpenAI) that picks up a new preset list by itself, every
live context judged with the old list is judged again once, with the new one; ``--dry-run``
only counts; no usable list is exit 4; workers that do not load the list in time are exit 1
and nothing is reset."""

from __future__ import annotations

import json
import re
from collections import Counter

import yaml
from sqlalchemy import text

from app.providers.openai_compatible import OpenAIEmbedder
from app.service.preset_loader import DEFAULT_PRESET_FILE, PresetFile, load_presets
from tests.core import support as facts
from tests.e2e.observe import wait_until
from tests.e2e.processes import core_environment, run_command
from tests.worker.harness import PROFILE
from tests.worker.support import make_preset

NOTES = 12
MARKER = re.compile(r"reprocess note (\d+)")
JUDGMENTS = text(
    "SELECT s.context_id, s.keyword_status, s.keyword_attempt, s.retry_count, "
    "s.keyword_reprocess_version, a.preset_version "
    "FROM ai.context_ai_state s LEFT JOIN ai.context_keyword_analysis a USING (context_id) "
    "ORDER BY s.context_id"
)


def _note(index: int) -> str:
    return f"reprocess note {index}: 창가 자리 조용하고 콘센트 많은 카페"


def _new_list() -> PresetFile:
    """The bundled list with every preset kept and two added."""
    data = yaml.safe_load(DEFAULT_PRESET_FILE.read_text(encoding="utf-8"))
    for offset, source in enumerate(data["presets"][:2]):
        added = dict(source)
        added.update(id=900 + offset, code=f"ADDED_{offset}", display_name=f"새 프리셋 {offset}")
        data["presets"].append(added)
    return PresetFile.model_validate(data)


async def _judgments(engine) -> list[tuple]:
    async with engine.connect() as conn:
        return [tuple(row) for row in await conn.execute(JUDGMENTS)]


async def _judged_notes(engine, core) -> list[int]:
    context_ids = []
    for index in range(NOTES):
        response = await core.create(1, _note(index), place=f"place-{index % 4}")
        context_ids.append(response.json()["contextId"])

    async def finished() -> bool:
        rows = await _judgments(engine)
        return len(rows) == NOTES and all(row[1] == "COMPLETED" for row in rows)

    await wait_until(finished, what="the notes judged with the first list")
    return context_ids


async def _stale_note(engine, core) -> int:
    """One live note judged with list 1, the stored list at 2; its create's dispatch settled
    (counted), so that nothing changes its row behind the test's back."""
    await make_preset(engine, preset_id=1, version=2, profile=PROFILE)
    response = await core.create(1, _note(0))
    record_id, context_id = response.json()["recordId"], response.json()["contextId"]
    await facts.make_judged(
        engine, context_id=context_id, user_id=1, record_id=record_id, profile=PROFILE,
        preset_version=1, keyword_ids=(1,),
    )  # fmt: skip

    async def counted() -> bool:
        return bool(
            await facts.count(
                engine,
                "SELECT count(*) FROM ai.context_ai_state WHERE context_id = :id "
                "AND dispatch_accepted_at IS NOT NULL",
                id=context_id,
            )
        )

    await wait_until(counted, what="the create's dispatch counted")
    return context_id


async def _reprocess(env, *args: str) -> tuple[int, list[str], str]:
    code, out, err = await run_command("core_service.cli", "reprocess", "keywords", *args, env=env)
    return code, out.splitlines(), err


async def test_every_stale_judgment_is_made_again_once_with_the_new_list(
    engine, make_worker, make_core, fake_openai, migrated_database
):
    async with make_worker(presets_refresh_seconds=0.2, keyword_similarity_floor=-1) as worker:
        url = str(worker.client.base_url)
        async with make_core(url) as core:
            context_ids = await _judged_notes(engine, core)
            embedder = OpenAIEmbedder.from_settings(worker.settings)
            try:
                loaded = await load_presets(engine, embedder, _new_list(), PROFILE)
            finally:
                await embedder.aclose()
            judged_before = len(fake_openai.judge_requests)
            embedded_before = fake_openai.embedding_calls
            env = core_environment(migrated_database, url)

            dry_code, dry, _ = await _reprocess(env, "--dry-run")
            code, lines, err = await _reprocess(env, "--rate", "5", "--wait", "30")

            async def rejudged() -> bool:
                return all(row[1] == "COMPLETED" for row in await _judgments(engine))

            await wait_until(rejudged, what="every note judged again")

    assert loaded.version == 2
    assert dry_code == 0
    assert dry == [
        f"preset list version 2 of profile {PROFILE}: would reset {NOTES} context(s) judged "
        "with an older list"
    ]
    assert code == 0, err[-3000:]
    assert lines[0] == (
        f"every worker is on preset list version 2 of profile {PROFILE}; {NOTES} context(s) "
        "to judge again, 5 a second at most"
    )
    assert [line.split(" (")[0] for line in lines[1:4]] == ["reset 5/12", "reset 10/12",
                                                            "reset 12/12"]  # fmt: skip
    assert lines[-1].startswith(f"reset {NOTES} context(s) for preset list version 2 in ")
    rows = await _judgments(engine)
    assert [row[0] for row in rows] == context_ids
    # Judged once more, with list 2, marked as a reprocess, its budget untouched.
    assert {row[1:] for row in rows} == {("COMPLETED", 2, 0, 2, 2)}
    judged = Counter(
        int(match.group(1))
        for request in fake_openai.judge_requests[judged_before:]
        for match in MARKER.finditer(json.dumps(request, ensure_ascii=False))
    )
    assert judged == dict.fromkeys(range(NOTES), 1)
    assert fake_openai.embedding_calls == embedded_before  # the stored vectors were reused


async def test_dry_run_only_counts(engine, core_with_fake_worker, fake_worker, migrated_database):
    await _stale_note(engine, core_with_fake_worker)
    before = await facts.state_rows(engine)
    requests = len(fake_worker.requests)
    env = core_environment(migrated_database, fake_worker.base_url)

    code, lines, _ = await _reprocess(env, "--dry-run")

    assert code == 0
    assert lines == [
        f"preset list version 2 of profile {PROFILE}: would reset 1 context(s) judged with an "
        "older list"
    ]
    assert await facts.state_rows(engine) == before
    assert len(fake_worker.requests) == requests


async def test_no_usable_list_is_exit_4(engine, fake_worker, migrated_database):
    env = core_environment(migrated_database, fake_worker.base_url)

    code, lines, err = await _reprocess(env, "--dry-run")

    assert (code, lines) == (4, [])
    assert err.strip() == (
        f"pinlog-core: no preset is usable under profile {PROFILE}: run `pinlog-ai presets "
        "load` with that profile first"
    )


async def test_workers_on_an_old_list_are_exit_1_and_nothing_is_reset(
    engine, core_with_fake_worker, fake_worker, migrated_database
):
    await _stale_note(engine, core_with_fake_worker)
    fake_worker.preset_version = 1
    before = await facts.state_rows(engine)
    env = core_environment(migrated_database, fake_worker.base_url)

    code, lines, err = await _reprocess(env, "--wait", "1")

    assert code == 1
    assert lines[0] == "waiting for every worker to report preset list version 2:"
    assert err.splitlines() == [
        "pinlog-core: not every worker reported preset list version 2 within 1 s; nothing was "
        "reset. Their last answers:",
        f"pinlog-core:   {fake_worker.base_url}: profile {PROFILE}, list version 1, ready",
    ]
    assert await facts.state_rows(engine) == before
