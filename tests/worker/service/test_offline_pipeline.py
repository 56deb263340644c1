"""The PINLOG_OFFLINE worker on the real database: encoder, padding, learned judge (§3-§5, §7)."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import text

from app.errors import ConfigurationError
from app.main import create_app
from app.providers.factory import build_embedding_provider
from app.repository.db import to_array
from app.service.preset_loader import load_presets, read_preset_file
from app.service.vector_columns import check_vector_columns
from app.settings import USE_PROFILE, Settings
from tests.worker.backfill_support import context_vectors_declared
from tests.worker.harness import SECRET, running_worker
from tests.worker.support import PROFILE as HASHING_PROFILE
from tests.worker.support import count_rows, fetch_state, make_embedding, make_state, vector

PETS_NOTE = "강아지랑 같이 들어갈 수 있는 카페라 자주 감"


def _offline(database_url: str, **overrides) -> Settings:
    values = {"database_url": database_url, "internal_secret": SECRET, "offline": True}
    values |= {"shutdown_grace_seconds": 2, **overrides}
    return Settings(**values)


@pytest.fixture
async def offline_settings(engine, migrated_database) -> Settings:
    """Offline settings with the bundled presets embedded by the real loader and encoder."""
    settings = _offline(migrated_database)
    embedder = build_embedding_provider(settings)
    await load_presets(engine, embedder, read_preset_file(), settings.embedding_profile)
    return settings


async def _codes(engine, context_id: int) -> set[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT p.code FROM ai.context_keyword k JOIN ai.keyword_preset p "
                "ON p.id = k.keyword_id WHERE k.context_id = :id"
            ),
            {"id": context_id},
        )
        return {row.code for row in rows}


async def test_offline_worker_stores_padded_vector_and_a_fitting_keyword(engine, offline_settings):
    await make_state(engine, context_id=1)

    async with running_worker(offline_settings) as worker:
        ready = await worker.client.get("/readyz")
        response = await worker.post(
            {"contextId": 1, "userId": 7, "recordId": 70, "text": PETS_NOTE}
        )
        await worker.drain()

    assert {key: ready.json()[key] for key in ("status", "mode")} == {
        "status": "ready",
        "mode": "offline",
    }
    assert ready.json()["providers"]["judge"]["available"] is True
    assert response.status_code == 202
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT embedding_profile, vector_dims(embedding) AS dims, embedding "
                    "FROM ai.context_embedding WHERE context_id = 1"
                )
            )
        ).one()
        model_profile = (
            await conn.execute(
                text("SELECT model_profile FROM ai.context_keyword_analysis WHERE context_id = 1")
            )
        ).scalar_one()
    stored = to_array(row.embedding)
    assert stored is not None
    assert (row.embedding_profile, row.dims) == (USE_PROFILE, 1536)
    assert not np.any(stored[512:])
    assert np.isclose(np.linalg.norm(stored), 1.0, atol=1e-5)
    assert "WITH_PETS" in await _codes(engine, 1)
    assert model_profile == offline_settings.judge_profile


async def test_vector_of_another_profile_is_not_reused_and_judgment_stops(engine, offline_settings):
    """§5: a COMPLETED hashing-profile vector (e.g. an old .pgdata) is neither reused nor
    regenerated; the keyword stage fails as a profile mismatch and writes no keywords."""
    await make_state(engine, context_id=2, embedding_status="COMPLETED")
    await make_embedding(engine, context_id=2, profile=HASHING_PROFILE, embedding=vector(2))

    async with running_worker(offline_settings) as worker:
        await worker.process(2, PETS_NOTE)

    assert await fetch_state(engine, 2) == ("COMPLETED", "FAILED")
    assert await count_rows(engine, "ai.context_keyword", 2) == 0
    async with engine.connect() as conn:
        profile = (
            await conn.execute(
                text("SELECT embedding_profile FROM ai.context_embedding WHERE context_id = 2")
            )
        ).scalar_one()
    assert profile == HASHING_PROFILE


async def test_offline_search_finds_the_note_by_meaning(engine, offline_settings):
    """§7 with padded vectors: the query is padded the same way, cosine is unchanged."""
    await make_state(engine, context_id=3)
    await make_state(engine, context_id=4)

    async with running_worker(offline_settings) as worker:
        await worker.process(3, PETS_NOTE, user_id=9, record_id=30)
        await worker.process(4, "야근 끝나고 새벽에 국밥 한 그릇", user_id=9, record_id=40)
        response = await worker.client.post(
            "/internal/v1/search",
            json={"userId": 9, "query": "반려견 동반 가능한 곳", "embeddingProfile": USE_PROFILE},
            headers={"X-Internal-Secret": SECRET},
        )

    results = response.json()["results"]
    assert response.status_code == 200
    assert [r["recordId"] for r in results] == [30, 40]
    assert all(-1.0 <= r["similarity"] <= 1.0 for r in results)


async def test_startup_fails_when_vectors_do_not_fit_the_column(engine, migrated_database):
    """The stored dimension (PINLOG_VECTOR_DIMENSION) must equal every declared dimension of
    a column the worker writes; since 0060 none declares one (one dimension per profile), so
    a worker of another stored dimension starts."""
    app = create_app(_offline(migrated_database, vector_dimension=1024))
    async with context_vectors_declared(engine, 1536):
        with pytest.raises(ConfigurationError, match=r"VECTOR\(1536\).*dimension 1024"):
            async with app.router.lifespan_context(app):
                pass

    await check_vector_columns(engine, 1024)
