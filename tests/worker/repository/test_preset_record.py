"""The preset record is named once (``PresetDefinition``, and ``PresetRow`` adding a profile's
vector); the statements, the file entry and the judge's candidate follow it, and the migrated
tables agree with it (§4; per-profile vectors: §1 Deviation)."""

from __future__ import annotations

import re
from dataclasses import fields, replace

import numpy as np
from sqlalchemy import text

from app.providers.base import JudgeCandidate
from app.repository import keyword_preset
from app.repository.keyword_preset import (
    LOAD_DEFINITIONS,
    LOAD_PROFILE_PRESETS,
    LOAD_USABLE_PRESETS,
    UPSERT_DEFINITION,
    PresetDefinition,
    PresetRow,
)
from app.service.preset_loader import PresetEntry
from tests.worker.support import PROFILE, vector

DEFINITION = [field.name for field in fields(PresetDefinition)]
RECORD = [field.name for field in fields(PresetRow)]
# Frozen by 0050: still in the table, never read or written.
FROZEN = ["embedding", "embedding_profile"]


def names(column_list: str) -> list[str]:
    return [name.strip() for name in column_list.split(",")]


def preset(preset_id: int = 1, **changes) -> PresetRow:
    row = PresetRow(
        id=preset_id,
        code=f"PRESET_{preset_id}",
        display_name="프리셋",
        category="ACTIVITY",
        description="설명",
        examples=("예시 하나", "예시 둘", "예시 셋"),
        embedding=vector(preset_id),
        embedding_profile=PROFILE,
        visibility="PUBLIC",
        is_active=True,
        version=1,
    )
    return replace(row, **changes)


async def columns_of(engine, table: str) -> list[str]:
    async with engine.connect() as conn:
        columns = await conn.scalars(
            text(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = 'ai' AND table_name = :table ORDER BY ordinal_position"
            ),
            {"table": table},
        )
        return list(columns)


async def test_the_migrated_tables_have_the_record_columns_in_order(engine):
    assert [c for c in await columns_of(engine, "keyword_preset") if c not in FROZEN] == DEFINITION
    assert await columns_of(engine, "keyword_preset_embedding") == [
        "preset_id",
        "embedding_profile",
        "embedding",
        "preset_version",
        "updated_at",
    ]


def test_every_select_reads_every_record_column():
    for statement, expected in (
        (LOAD_DEFINITIONS, DEFINITION),
        (LOAD_USABLE_PRESETS, RECORD),
        (LOAD_PROFILE_PRESETS, RECORD),
    ):
        selected = re.fullmatch(r"SELECT (.+?)\s+FROM ai\.keyword_preset\b.*", str(statement), re.S)
        assert selected is not None, str(statement)
        assert [name.split(".")[-1] for name in names(selected.group(1))] == expected


def test_the_upsert_writes_every_shared_column_and_updates_all_but_id_and_code():
    upsert = re.fullmatch(
        r"INSERT INTO ai\.keyword_preset \((.+)\)\s+VALUES \((.+)\)\s+"
        r"ON CONFLICT \(id\) DO UPDATE SET (.+)",
        str(UPSERT_DEFINITION),
        re.S,
    )
    assert upsert is not None, str(UPSERT_DEFINITION)
    inserted, values, updates = upsert.groups()
    assert names(inserted) == DEFINITION
    assert names(values) == [":" + name for name in DEFINITION]
    assignments = [update.split(" = ") for update in names(updates)]
    assert [target for target, _ in assignments] == [
        name for name in DEFINITION if name not in ("id", "code")
    ]
    assert all(source == "EXCLUDED." + target for target, source in assignments)


def test_a_file_entry_is_the_record_without_what_a_load_supplies():
    supplied = {"embedding", "embedding_profile", "version"}
    assert list(PresetEntry.model_fields) == [name for name in RECORD if name not in supplied]


def test_a_judge_candidate_takes_its_preset_fields_from_the_record():
    candidate = {field.name for field in fields(JudgeCandidate)} - {"similarity"}
    assert candidate <= set(RECORD)


async def test_a_record_written_is_read_back_equal(engine):
    written = [preset(1), preset(2, visibility="BLOCKED", is_active=False, version=3)]
    async with engine.begin() as conn:
        await keyword_preset.upsert_all(conn, written)
    async with engine.connect() as conn:
        read = await keyword_preset.load_profile(conn, PROFILE)
        definitions = await keyword_preset.load_definitions(conn)
    assert_same(read, written)
    assert definitions == [row.definition() for row in written]


async def test_an_upsert_changes_every_shared_column_but_the_code_and_adds_a_profile(engine):
    async with engine.begin() as conn:
        await keyword_preset.upsert_all(conn, [preset(1)])
    changed = PresetRow(
        id=1,
        code="RENAMED",
        display_name="바뀐 이름",
        category="SITUATION",
        description="바뀐 설명",
        examples=("하나", "둘", "셋", "넷"),
        embedding=vector("changed"),
        embedding_profile="other-model-1536-cosine-v1",
        visibility="PRIVATE_ONLY",
        is_active=False,
        version=2,
    )
    async with engine.begin() as conn:
        await keyword_preset.upsert_all(conn, [changed])
    async with engine.connect() as conn:
        read = await keyword_preset.load_profile(conn, "other-model-1536-cosine-v1")
        first = await keyword_preset.load_profile(conn, PROFILE)
    assert_same(read, [replace(changed, code="PRESET_1")])
    # The first profile's vector stays as it was; the shared fields are the new ones.
    assert_same(
        first, [replace(changed, code="PRESET_1", embedding=vector(1), embedding_profile=PROFILE)]
    )


def assert_same(read: list[PresetRow], expected: list[PresetRow]) -> None:
    assert len(read) == len(expected)
    for got, want in zip(read, expected, strict=True):
        assert got.embedding.dtype == np.float32
        np.testing.assert_allclose(got.embedding, want.embedding, rtol=1e-6)
        assert replace(got, embedding=None) == replace(want, embedding=None)
