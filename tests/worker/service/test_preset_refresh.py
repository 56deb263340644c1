"""Workers pick up a new preset list without a restart (§4 Deviation): the cache reloads in
the background every ``PINLOG_PRESETS_REFRESH_SECONDS``, ``/readyz`` reports the version of
the list loaded, judgments after the refresh carry it, and a refresh that fails keeps the last
list with one WARNING."""

from __future__ import annotations

import asyncio
import logging

import yaml
from sqlalchemy import text

from app.providers.openai_compatible import OpenAIEmbedder
from app.service.preset_loader import DEFAULT_PRESET_FILE, PresetFile, load_presets
from tests.worker.harness import PROFILE
from tests.worker.support import make_state, records_at_least, stored_analysis

NOTE = "창가 자리가 조용해서 노트북 작업하기 좋음"
FAST_REFRESH_SECONDS = 0.2


async def ready_version(worker) -> int:
    response = await worker.client.get("/readyz")
    assert response.status_code == 200, response.text
    return response.json()["presetVersion"]


async def until_version(worker, version: int, timeout_seconds: float = 10.0) -> None:
    async with asyncio.timeout(timeout_seconds):
        while await ready_version(worker) != version:  # noqa: ASYNC110
            await asyncio.sleep(0.05)  # polls /readyz: the refresh has no event to wait on


def changed_list() -> PresetFile:
    """The bundled list with one description edited and one preset added."""
    data = yaml.safe_load(DEFAULT_PRESET_FILE.read_text(encoding="utf-8"))
    data["presets"][0]["description"] += " 다시 씀."
    added = dict(data["presets"][1])
    added.update(id=900, code="ADDED_IN_V2", display_name="새 프리셋")
    data["presets"].append(added)
    return PresetFile.model_validate(data)


async def test_a_new_list_is_picked_up_without_a_restart(
    engine, make_worker, fake_openai, migrated_database
):
    await make_state(engine, context_id=1)
    await make_state(engine, context_id=2)
    async with make_worker(presets_refresh_seconds=FAST_REFRESH_SECONDS) as worker:
        assert await ready_version(worker) == 1
        await worker.process(1, NOTE)
        embedder = OpenAIEmbedder.from_settings(worker.settings)
        try:
            report = await load_presets(engine, embedder, changed_list(), PROFILE)
        finally:
            await embedder.aclose()
        assert (report.version, report.list_changed) == (2, True)

        await until_version(worker, 2)
        snapshot = worker.app.state.presets.snapshot()
        await worker.process(2, NOTE)

    assert 900 in {preset.id for preset in snapshot.presets}
    first, second = await stored_analysis(engine, 1), await stored_analysis(engine, 2)
    assert first is not None and first.preset_version == 1
    assert second is not None and second.preset_version == 2


async def test_a_failed_refresh_keeps_the_last_list_with_one_warning(engine, make_worker, caplog):
    """Another profile's load changed the list: this profile has no current vector any more,
    so nothing is usable; the worker keeps judging with the list it has and stays ready."""
    async with make_worker() as worker:
        cache = worker.app.state.presets
        async with engine.begin() as conn:
            await conn.execute(text("UPDATE ai.keyword_preset SET version = 2"))
        caplog.clear()

        refreshed = await cache.refresh_once()

        warnings = [
            r for r in records_at_least(caplog, logging.WARNING) if r.name == "app.service.presets"
        ]
        assert refreshed is False
        assert len(warnings) == 1
        assert "keeping list version 1" in warnings[0].getMessage()
        assert await ready_version(worker) == 1
        assert cache.snapshot().version == 1
        async with engine.begin() as conn:  # the profile loaded: picked up by the next refresh
            await conn.execute(text("UPDATE ai.keyword_preset_embedding SET preset_version = 2"))
        assert await cache.refresh_once() is True
        assert await ready_version(worker) == 2


async def test_the_refresh_never_touches_the_request_path(engine, make_worker, hold, fake_openai):
    """A judgment in flight keeps the snapshot it took while a refresh swaps in a new list."""
    await make_state(engine, context_id=1)
    async with make_worker(presets_refresh_seconds=FAST_REFRESH_SECONDS) as worker:
        held = hold()
        fake_openai.script_judge(held)
        task = asyncio.create_task(worker.process(1, NOTE))
        await asyncio.wait_for(asyncio.to_thread(held.entered.wait, 10), 15)
        async with engine.begin() as conn:
            await conn.execute(text("UPDATE ai.keyword_preset SET version = 5"))
            await conn.execute(text("UPDATE ai.keyword_preset_embedding SET preset_version = 5"))
        await until_version(worker, 5)
        held.block.set()
        await task

    analysis = await stored_analysis(engine, 1)
    assert analysis is not None and analysis.preset_version == 1
