"""``pinlog-ai presets load`` semantics (§4): validation, idempotence, version bumps, retiring;
one profile's load never touches another profile's vectors (§1 Deviation)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml
from sqlalchemy import text

from app.providers.openai_compatible import OpenAIEmbedder
from app.service.preset_loader import (
    DEFAULT_PRESET_FILE,
    PresetFile,
    PresetFileError,
    load_presets,
    read_preset_file,
)
from tests.worker.harness import PROFILE, worker_settings


@pytest.fixture
async def embedder(migrated_database, fake_openai):
    embedder = OpenAIEmbedder.from_settings(worker_settings(migrated_database, fake_openai))
    yield embedder
    await embedder.aclose()


def bundled() -> dict:
    return yaml.safe_load(DEFAULT_PRESET_FILE.read_text(encoding="utf-8"))


OTHER = "openai-text-embedding-3-small-1536-cosine-v2"


async def stored(engine, profile: str = PROFILE) -> list[tuple[int, str, bool, int, int | None]]:
    """``(id, code, is_active, version, revision of its vector of profile)`` by id."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT p.id, p.code, p.is_active, p.version, e.preset_version "
                "FROM ai.keyword_preset AS p LEFT JOIN ai.keyword_preset_embedding AS e "
                "ON e.preset_id = p.id AND e.embedding_profile = :profile ORDER BY p.id"
            ),
            {"profile": profile},
        )
        return [tuple(row) for row in rows]


async def vectors_of(engine, profile: str) -> dict[int, tuple[str, int, object]]:
    """``{preset_id: (vector as text, revision, updated_at)}`` of one profile."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT preset_id, embedding::text, preset_version, updated_at "
                "FROM ai.keyword_preset_embedding WHERE embedding_profile = :profile"
            ),
            {"profile": profile},
        )
        return {row[0]: tuple(row[1:]) for row in rows}


def test_bundled_preset_file_is_valid_and_has_the_required_mix():
    preset_file = read_preset_file()
    assert 25 <= len(preset_file.presets) <= 30
    categories = {preset.category for preset in preset_file.presets}
    assert categories == {"COMPANION", "ACTIVITY", "ATMOSPHERE", "SITUATION"}
    visibilities = [preset.visibility for preset in preset_file.presets]
    assert visibilities.count("BLOCKED") >= 1
    assert visibilities.count("PRIVATE_ONLY") >= 1
    assert all(len(preset.examples) >= 3 for preset in preset_file.presets)


async def test_first_load_embeds_all_in_one_call_and_writes_version_1(
    engine, embedder, fake_openai
):
    preset_file = read_preset_file()

    report = await load_presets(engine, embedder, preset_file, PROFILE)

    assert (report.changed, report.version, report.presets) == (True, 1, len(preset_file.presets))
    assert fake_openai.embedding_calls == 1
    rows = await stored(engine)
    assert len(rows) == len(preset_file.presets)
    assert {(version, revision) for *_, version, revision in rows} == {(1, 1)}


async def test_second_load_of_the_same_file_changes_nothing(engine, embedder, fake_openai):
    preset_file = read_preset_file()
    await load_presets(engine, embedder, preset_file, PROFILE)
    before = await stored(engine)

    report = await load_presets(engine, embedder, preset_file, PROFILE)

    assert (report.changed, report.version) == (False, 1)
    assert fake_openai.embedding_calls == 1
    assert await stored(engine) == before


async def test_changed_content_bumps_the_list_version_for_every_row(engine, embedder):
    await load_presets(engine, embedder, read_preset_file(), PROFILE)
    data = bundled()
    data["presets"][0]["description"] += " 수정됨."

    report = await load_presets(engine, embedder, PresetFile.model_validate(data), PROFILE)

    assert (report.changed, report.version, report.list_changed) == (True, 2, True)
    assert {(row[3], row[4]) for row in await stored(engine)} == {(2, 2)}


async def test_two_overlapping_loads_never_write_one_version_for_two_lists(
    engine, embedder, fake_openai, hold
):
    await load_presets(engine, embedder, read_preset_file(), PROFILE)
    first, second = bundled(), bundled()
    first["presets"][0]["description"] += " 첫째 판."
    second["presets"][0]["description"] += " 둘째 판."
    held = hold()
    fake_openai.script_embeddings(held)
    # The first load reads version 1, then waits inside its provider call...
    first_load = asyncio.create_task(
        load_presets(engine, embedder, PresetFile.model_validate(first), PROFILE)
    )
    await asyncio.to_thread(held.entered.wait, 10)
    # ...while the second reads the same version 1 and commits its list as version 2.
    second_report = await load_presets(engine, embedder, PresetFile.model_validate(second), PROFILE)
    held.block.set()
    first_report = await asyncio.wait_for(first_load, 10)

    assert (second_report.version, first_report.version) == (2, 3)
    async with engine.connect() as conn:
        description, version = (
            await conn.execute(
                text("SELECT description, version FROM ai.keyword_preset WHERE id = :id"),
                {"id": first["presets"][0]["id"]},
            )
        ).one()
    assert (description, version) == (first["presets"][0]["description"], 3)
    assert {(row[3], row[4]) for row in await stored(engine)} == {(3, 3)}


async def test_preset_missing_from_the_file_is_retired_not_deleted(engine, embedder):
    await load_presets(engine, embedder, read_preset_file(), PROFILE)
    data = bundled()
    removed = data["presets"].pop(0)

    report = await load_presets(engine, embedder, PresetFile.model_validate(data), PROFILE)

    assert report.retired == 1
    rows = {row[0]: row for row in await stored(engine)}
    assert rows[removed["id"]][2] is False


async def test_a_second_profile_gets_its_own_vectors_and_leaves_the_first_untouched(
    engine, embedder, fake_openai
):
    await load_presets(engine, embedder, read_preset_file(), PROFILE)
    first = await vectors_of(engine, PROFILE)

    report = await load_presets(engine, embedder, read_preset_file(), OTHER)

    # Same list: its vectors only, no new list version, the first profile's rows as they were.
    assert (report.changed, report.list_changed, report.version) == (True, False, 1)
    assert fake_openai.embedding_calls == 2
    assert await vectors_of(engine, PROFILE) == first
    assert {(row[3], row[4]) for row in await stored(engine, OTHER)} == {(1, 1)}
    again = await load_presets(engine, embedder, read_preset_file(), OTHER)
    assert (again.changed, fake_openai.embedding_calls) == (False, 2)


async def test_a_changed_list_under_one_profile_leaves_the_others_vectors_stale_until_loaded(
    engine, embedder
):
    await load_presets(engine, embedder, read_preset_file(), PROFILE)
    await load_presets(engine, embedder, read_preset_file(), OTHER)
    other_before = await vectors_of(engine, OTHER)
    data = bundled()
    data["presets"][0]["description"] += " 수정됨."
    changed = PresetFile.model_validate(data)

    report = await load_presets(engine, embedder, changed, PROFILE)

    assert (report.version, report.list_changed) == (2, True)
    assert await vectors_of(engine, OTHER) == other_before  # untouched, now stale (revision 1)
    assert {row[4] for row in await stored(engine, OTHER)} == {1}
    caught_up = await load_presets(engine, embedder, changed, OTHER)
    assert (caught_up.changed, caught_up.list_changed, caught_up.version) == (True, False, 2)
    assert {(row[3], row[4]) for row in await stored(engine, OTHER)} == {(2, 2)}
    assert {row[4] for row in await stored(engine, PROFILE)} == {2}


async def test_code_of_a_stored_id_is_immutable(engine, embedder):
    await load_presets(engine, embedder, read_preset_file(), PROFILE)
    data = bundled()
    data["presets"][0]["code"] = "RENAMED_CODE"

    with pytest.raises(PresetFileError, match="code is immutable"):
        await load_presets(engine, embedder, PresetFile.model_validate(data), PROFILE)


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d["presets"][0].update(category="FOOD"), "category"),
        (lambda d: d["presets"][0].update(examples=["하나"]), "examples"),
        (lambda d: d["presets"][1].update(id=d["presets"][0]["id"]), "ids must be unique"),
        (lambda d: d["presets"][0].update(visibility="SECRET"), "visibility"),
        (lambda d: d["presets"][0].update(colour="red"), "colour"),
    ],
)
def test_invalid_preset_file_names_the_field(tmp_path: Path, mutate, field):
    data = bundled()
    mutate(data)
    path = tmp_path / "presets.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")

    with pytest.raises(PresetFileError, match=field):
        read_preset_file(path)
