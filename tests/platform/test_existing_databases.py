"""A database migrated before the migrations moved into ``pinlog_platform.contract.schema`` upgrades
with nothing to apply: the files keep their names and bytes, the ledger table and the
advisory-lock key stay as they were (the runner refuses an applied file whose content changed).
"""

from __future__ import annotations

from sqlalchemy import text

from app.repository import keyword_preset
from app.repository.db import create_engine
from pinlog_platform.contract import preset_list
from pinlog_platform.contract import schema as migrations
from pinlog_platform.contract.schema import runner

# The ledger of a database fully migrated by the last runner of ``pinlog_schema`` (the
# package before the move): file name -> SHA-256 of its content, as that runner recorded it.
LEDGER_BEFORE_THE_MOVE = {
    "0001_schemas.sql": "0ee3247ad511d3ca4758d2d787c6fc70b7a000632b05616f27ff98159540917c",
    "0002_ai_tables.sql": "d2fa862f259d3285ce2f77aa4cabe96fdbe68eb764ebfa9686fb2a9af32b3f3d",
    "0003_context_text_fingerprint.sql": (
        "b37f0167d11d51809392eb15799e67075609a7b66a8081f29edfb4100ada2f17"
    ),
    "0004_worker_role.sql": "50198b554dfca4761b7c82f78266792eb95402982f15782d815850c80f2e6f6b",
    "0005_core_tables.sql": "7563d55f7f5fcce824499bfd1ff8d7e7857f374bdd9b757ac8c73208cd00d90a",
    "0006_ai_state_core_columns.sql": (
        "08a0e4bdb4471277f452271d81d942bed0bb569e006cf3266537f4c9468a8658"
    ),
    "0007_core_context_body_check.sql": (
        "d9aaada6cca8fea182f77761bda063d142a79183514675291e20ac7e36910971"
    ),
    "0008_stage_attempts.sql": "9d97355c095d33c451169c3c80a6685aa9e4ccc4cfef6ea921c6ce145a3a8c6a",
    "0009_state_row_fingerprint.sql": (
        "d36895dfea46ca015099c341df292eb5b144aa04c2ee84cd1c9990674e458198"
    ),
}
# What that runner created and locked on, verbatim.
LEDGER_DDL_BEFORE_THE_MOVE = """
    CREATE SCHEMA IF NOT EXISTS ai;
    CREATE TABLE IF NOT EXISTS ai.stub_migration (
        filename   TEXT PRIMARY KEY,
        sha256     TEXT NOT NULL,
        applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )
"""
LOCK_BEFORE_THE_MOVE = "SELECT pg_advisory_xact_lock(hashtext('pinlog-ai/migrations_stub'))"


def test_the_moved_files_are_byte_identical_to_the_applied_ones():
    bundled = {file.filename: file.sha256 for file in migrations.discover()}
    assert {name: bundled.get(name) for name in LEDGER_BEFORE_THE_MOVE} == LEDGER_BEFORE_THE_MOVE


def test_ledger_table_and_lock_key_are_unchanged():
    assert runner.CREATE_LEDGER == LEDGER_DDL_BEFORE_THE_MOVE
    assert str(runner.LOCK_MIGRATIONS) == LOCK_BEFORE_THE_MOVE


async def test_a_database_migrated_before_the_move_upgrades_with_nothing_to_apply(empty_database):
    engine = create_engine(empty_database, with_vector_codec=False)
    try:
        # The state the previous runner left: every file applied, its ledger rows written.
        async with engine.begin() as conn:
            raw = (await conn.get_raw_connection()).driver_connection
            await raw.execute(LEDGER_DDL_BEFORE_THE_MOVE)
            for file in migrations.discover():
                if file.filename in LEDGER_BEFORE_THE_MOVE:
                    await raw.execute(file.sql)
            for filename, sha in LEDGER_BEFORE_THE_MOVE.items():
                await conn.execute(
                    text("INSERT INTO ai.stub_migration (filename, sha256) VALUES (:f, :s)"),
                    {"f": filename, "s": sha},
                )
        applied = await migrations.upgrade(engine)
        again = await migrations.upgrade(engine)
    finally:
        await engine.dispose()
    newer = [f.filename for f in migrations.discover() if f.filename not in LEDGER_BEFORE_THE_MOVE]
    assert applied == newer  # only files added after the move, none of the old ones again
    assert again == []


async def test_a_database_with_presets_and_judgments_upgrades_to_vectors_per_profile(
    make_empty_database, migrations_dir, tmp_path
):
    """0050 moves every preset vector to ``ai.keyword_preset_embedding`` under its profile,
    current for its preset's version; the shared rows, the frozen columns, the judgments and
    their keyword rows stay as they were, and the worker reads the same usable list."""
    before = tmp_path / "before"
    before.mkdir()
    for file in sorted(migrations_dir.glob("*.sql")):
        if file.name < "0050":
            (before / file.name).write_text(file.read_text(encoding="utf-8"), encoding="utf-8")
    url = await make_empty_database()
    bare = create_engine(url, with_vector_codec=False)  # before the extension exists
    try:
        await migrations.upgrade(bare, directory=before)
    finally:
        await bare.dispose()
    engine = create_engine(url)
    profile = "openai-text-embedding-3-small-1536-cosine-v1"
    try:
        async with engine.begin() as conn:
            for preset_id, visibility, active in ((1, "PUBLIC", True), (2, "BLOCKED", True),
                                                  (3, "PUBLIC", False)):  # fmt: skip
                await conn.execute(
                    text(
                        "INSERT INTO ai.keyword_preset (id, code, display_name, category, "
                        "description, examples, embedding, embedding_profile, visibility, "
                        "is_active, version) VALUES (:id, :code, '이름', 'ACTIVITY', '설명', "
                        "'{하나,둘,셋}', :v, :p, :vis, :active, 4)"
                    ),
                    {"id": preset_id, "code": f"P{preset_id}", "v": _unit(preset_id),
                     "p": profile, "vis": visibility, "active": active},
                )  # fmt: skip
            await conn.execute(
                text(
                    "INSERT INTO ai.context_ai_state (context_id, embedding_status, "
                    "keyword_status) VALUES (10, 'COMPLETED', 'COMPLETED')"
                )
            )
            await conn.execute(
                text(
                    "INSERT INTO ai.context_keyword (context_id, keyword_id, confidence, "
                    "preset_version) VALUES (10, 1, 0.9, 4)"
                )
            )
        applied = await migrations.upgrade(engine)
        async with engine.connect() as conn:
            vectors = (
                await conn.execute(
                    text(
                        "SELECT preset_id, embedding_profile, preset_version, embedding::text "
                        "FROM ai.keyword_preset_embedding ORDER BY preset_id"
                    )
                )
            ).all()
            frozen = (
                (
                    await conn.execute(
                        text("SELECT embedding::text FROM ai.keyword_preset ORDER BY id")
                    )
                )
                .scalars()
                .all()
            )
            kept = (
                await conn.execute(
                    text(
                        "SELECT s.keyword_status, s.keyword_reprocess_version, k.keyword_id "
                        "FROM ai.context_ai_state s JOIN ai.context_keyword k USING (context_id)"
                    )
                )
            ).one()
            usable = await keyword_preset.load_usable(conn, profile)
            list_version = (
                await conn.execute(preset_list.LIST_VERSION, {"profile": profile})
            ).scalar_one()
    finally:
        await engine.dispose()
    assert {"0050_keyword_preset_embedding.sql", "0051_keyword_reprocess_marker.sql"} <= set(
        applied
    )
    assert [(p, prof, v) for p, prof, v, _ in vectors] == [(i, profile, 4) for i in (1, 2, 3)]
    assert [vector for *_, vector in vectors] == frozen  # moved, value for value
    assert tuple(kept) == ("COMPLETED", None, 1)
    assert [preset.id for preset in usable] == [1]
    assert list_version == 4


def _unit(seed: int) -> list[float]:
    vector = [0.0] * 1536
    vector[seed] = 1.0
    return vector
