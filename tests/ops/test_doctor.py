"""``pinlog-ai doctor``: each invariant violation it names is created for real and reported;
legal states are information only; a clean database reports nothing (exit 0)."""

from __future__ import annotations

import asyncio
import os
import sys

import numpy as np
import pytest
from sqlalchemy import text

from app.errors import ConfigurationError
from app.service.doctor import CHECKS, examine
from app.service.vector_columns import check_vector_columns
from tests.worker.backfill_support import context_vectors_declared, make_backfill
from tests.worker.support import (
    DIMENSION,
    PROFILE,
    make_embedding,
    make_keyword,
    make_preset,
    make_preset_vector,
    make_state,
)

EXPIRY = 600


async def _examine(engine, *, dimension: int = DIMENSION):
    return await examine(
        engine, dimension=dimension, profile=PROFILE, processing_expiry_seconds=EXPIRY
    )


async def _make_every_finding(engine) -> None:
    # Violations, two of the first kind so counts and examples are told apart.
    for context_id in (11, 12):
        await make_state(
            engine, context_id=context_id, embedding_status="CANCELLED", keyword_status="CANCELLED"
        )
        await make_embedding(engine, context_id=context_id, is_deleted=False)
    await make_state(engine, context_id=21, embedding_status="COMPLETED")
    await make_state(
        engine, context_id=31, embedding_status="PROCESSING", keyword_status="COMPLETED"
    )
    await make_state(
        engine,
        context_id=41,
        embedding_status="PROCESSING",
        retry_count=3,
        updated_seconds_ago=EXPIRY + 60,
    )
    await make_preset(engine, preset_id=51, embedding=np.zeros(DIMENSION, dtype=np.float32))
    # Information: keyword rows left by a COMPLETED -> PENDING reset (61, 71), and an
    # embedding of an older profile (71).
    await make_preset(engine, preset_id=52)
    await make_state(engine, context_id=61, embedding_status="COMPLETED")
    await make_embedding(engine, context_id=61)
    await make_keyword(engine, context_id=61, keyword_id=52)
    await make_state(engine, context_id=71, embedding_status="COMPLETED")
    await make_embedding(engine, context_id=71, profile="old-model-1536-cosine-v1")
    await make_keyword(engine, context_id=71, keyword_id=52)


async def test_clean_database_reports_nothing(engine) -> None:
    await make_preset(engine, preset_id=1)
    await make_state(engine, context_id=1, embedding_status="COMPLETED", keyword_status="COMPLETED")
    await make_embedding(engine, context_id=1)
    await make_keyword(engine, context_id=1, keyword_id=1)
    await make_state(engine, context_id=2, embedding_status="CANCELLED", keyword_status="CANCELLED")
    await make_embedding(engine, context_id=2, is_deleted=True)
    # Stale PROCESSING with budget left is the rescan's to recover, not a violation.
    await make_state(
        engine, context_id=3, embedding_status="PROCESSING", updated_seconds_ago=EXPIRY + 60
    )

    report = await _examine(engine)

    assert report.violations == 0
    # Information about a healthy database: one profile's vectors and presets, nothing else.
    expected = {c.name: 0 for c in CHECKS} | {"vectors_by_profile": 1, "presets_by_profile": 1}
    assert {f.check.name: f.total for f in report.findings} == expected
    assert report.by_name("vectors_by_profile").examples == (f"{PROFILE}: 1 live, 1 hidden",)
    assert report.by_name("presets_by_profile").examples == (
        f"{PROFILE}: 1 usable, list version 1",
    )


async def test_each_violation_and_information_is_reported_with_examples(engine) -> None:
    await _make_every_finding(engine)

    report = await _examine(engine)

    found = {f.check.name: (f.total, f.examples) for f in report.findings}
    assert found == {
        "cancelled_embedding_not_deleted": (2, ("11", "12")),
        "completed_embedding_without_row": (1, ("21",)),
        "keyword_completed_before_embedding": (1, ("31",)),
        "stale_processing_retries_exhausted": (1, ("41",)),
        "broken_preset_vectors": (1, ("51",)),
        "vector_column_dimension": (0, ()),
        "keywords_of_unfinished_stage": (2, ("61", "71")),
        "embeddings_of_other_profile": (1, ("71",)),
        "vectors_by_profile": (
            2,
            (f"{PROFILE}: 3 live, 0 hidden", "old-model-1536-cosine-v1: 1 live, 0 hidden"),
        ),
        "presets_by_profile": (1, (f"{PROFILE}: 2 usable, list version 1",)),
        "completed_without_vector_of_profile": (2, ("21", "71")),
        "backfill_rows": (0, ()),
    }
    assert report.violations == 6


async def test_examples_stop_at_five_and_the_count_does_not(engine) -> None:
    for context_id in range(1, 9):
        await make_state(engine, context_id=context_id, embedding_status="COMPLETED")

    finding = (await _examine(engine)).by_name("completed_embedding_without_row")

    assert finding.total == 8
    assert finding.examples == ("1", "2", "3", "4", "5")


async def test_configured_dimension_against_columns_and_presets(engine) -> None:
    await make_preset(engine, preset_id=1)

    # The written vector columns declare no dimension since 0060 (one per profile), and the
    # frozen preset column (0050) is written by nobody: any stored dimension fits.
    report = await _examine(engine, dimension=768)
    assert report.by_name("vector_column_dimension").total == 0
    assert report.by_name("broken_preset_vectors").examples == ("1",)
    await check_vector_columns(engine, 768)

    # A schema that still declares one (before 0060) is checked against the setting.
    async with context_vectors_declared(engine, 1536):
        columns = (await _examine(engine, dimension=768)).by_name("vector_column_dimension")
        assert columns.examples == ("ai.context_embedding.embedding is vector(1536)",)
        with pytest.raises(
            ConfigurationError, match=r"with dimension 768 \(PINLOG_VECTOR_DIMENSION\)"
        ):
            await check_vector_columns(engine, 768)
        await check_vector_columns(engine, DIMENSION)


async def test_a_switch_in_progress_is_reported_by_profile(engine) -> None:
    """Two profiles' vectors and presets, and the backfill's rows by status (0060)."""
    other = "local-small-256-cosine-v1"
    await make_preset(engine, preset_id=1)
    async with engine.begin() as conn:
        await make_preset_vector(
            conn, preset_id=1, profile=other, embedding=np.ones(256, np.float32)
        )
    for context_id in (1, 2, 3):
        await make_state(engine, context_id=context_id, embedding_status="COMPLETED")
        await make_embedding(engine, context_id=context_id)
    await make_embedding(engine, context_id=1, profile=other, embedding=np.ones(256, np.float32))
    for context_id, status in ((1, "COMPLETED"), (2, "PENDING"), (3, "PROCESSING")):
        await make_backfill(engine, context_id=context_id, profile=other, status=status)

    report = await _examine(engine)

    assert report.violations == 0
    assert report.by_name("vectors_by_profile").examples == (
        f"{PROFILE}: 3 live, 0 hidden",
        f"{other}: 1 live, 0 hidden",
    )
    assert report.by_name("presets_by_profile").total == 2
    backfill = report.by_name("backfill_rows")
    assert backfill.total == 2
    assert backfill.examples == (
        f"{other} COMPLETED: 1",
        f"{other} PENDING: 1",
        f"{other} PROCESSING: 1",
    )
    # Seen from a worker of the other profile, two contexts still lack its vector.
    seen_from_other = await examine(
        engine, dimension=256, profile=other, processing_expiry_seconds=EXPIRY
    )
    assert seen_from_other.by_name("completed_without_vector_of_profile").examples == ("2", "3")


async def test_a_profile_without_vectors_beside_one_with_them_is_warned_about(engine) -> None:
    """doctor run with the wrong profile (no PINLOG_OFFLINE on the offline demo's database)
    says so instead of checking a profile nothing uses in silence; no warning while the
    checked profile has vectors, or while no profile has any."""
    other = "local-use-multilingual-v3-512-cosine-v1"
    assert (await _examine(engine)).warnings == ()
    await make_state(engine, context_id=1, embedding_status="COMPLETED")
    await make_embedding(engine, context_id=1, profile=other)

    warned = await _examine(engine)

    assert warned.warnings == (
        f"profile {PROFILE} has no vectors, but 1 belong to {other}: the profile-specific "
        "checks looked at a profile nothing uses; set PINLOG_EMBEDDING_PROFILE (or "
        "PINLOG_OFFLINE=true) to the workers' profile",
    )
    assert warned.violations == 0
    await make_state(engine, context_id=2, embedding_status="COMPLETED")
    await make_embedding(engine, context_id=2)
    assert (await _examine(engine)).warnings == ()


async def test_doctor_writes_nothing(engine) -> None:
    await _make_every_finding(engine)
    snapshot = text(
        "SELECT md5(string_agg(t::text, ',' ORDER BY t::text)) FROM ai.context_ai_state t"
    )
    async with engine.connect() as conn:
        before = (await conn.execute(snapshot)).scalar_one()
    await _examine(engine)
    async with engine.connect() as conn:
        assert (await conn.execute(snapshot)).scalar_one() == before


async def _doctor(database_url: str) -> tuple[int, list[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PINLOG_")}
    # No PINLOG_INTERNAL_SECRET: it guards the HTTP API, and doctor serves none.
    env.update(
        PINLOG_DATABASE_URL=database_url,
        PINLOG_EMBEDDING_PROVIDER="hashing",
        PINLOG_EMBEDDING_MODEL="hashing-char-ngram",
        PINLOG_EMBEDDING_PROFILE=PROFILE,
        PINLOG_JUDGE_PROVIDER="similarity",
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "app.cli", "doctor",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, _ = await process.communicate()
    return process.returncode, stdout.decode().splitlines()


async def test_cli_exit_code_and_lines(engine, migrated_database) -> None:
    code, lines = await _doctor(migrated_database)
    assert code == 0
    assert lines[-1] == "doctor: 0 violation(s)"

    await _make_every_finding(engine)
    code, lines = await _doctor(migrated_database)

    assert code == 1
    assert len(lines) == len(CHECKS) + 1
    assert lines[0] == (
        "VIOLATION cancelled_embedding_not_deleted: 2 (e.g. 11, 12) - embeddings of CANCELLED "
        "contexts with is_deleted = false (§9)"
    )
    assert lines[5].startswith("ok        vector_column_dimension: 0 - ")
    assert lines[6].startswith("info      keywords_of_unfinished_stage: 2 (e.g. 61, 71) - ")
    assert lines[-1] == "doctor: 6 violation(s)"
