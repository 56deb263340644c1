"""Pre-check read, preset loading and the text fingerprint (§3.1, §4, §3 scenario 5)."""

from __future__ import annotations

import hashlib

import numpy as np

from app.repository import context_ai_state, context_text_fingerprint, keyword_preset
from app.repository.context_text_fingerprint import FingerprintMatch
from app.states import Status
from tests.builders import PROFILE, make_embedding, make_preset, make_state, vector


async def test_load_progress_returns_statuses_vector_and_profile(engine):
    await make_state(engine, context_id=1, embedding_status="COMPLETED")
    await make_embedding(engine, context_id=1, embedding=vector("x"))
    async with engine.connect() as conn:
        progress = await context_ai_state.load_progress(conn, 1)
    assert progress.embedding_status is Status.COMPLETED
    assert progress.keyword_status is Status.PENDING
    assert progress.embedding_profile == PROFILE
    np.testing.assert_allclose(progress.embedding, vector("x"), rtol=1e-6)


async def test_load_progress_without_embedding_row(engine):
    await make_state(engine, context_id=1)
    async with engine.connect() as conn:
        progress = await context_ai_state.load_progress(conn, 1)
    assert progress.embedding is None and progress.embedding_profile is None


async def test_load_progress_without_state_row_is_none(engine):
    async with engine.connect() as conn:
        assert await context_ai_state.load_progress(conn, 1) is None


async def test_usable_presets_exclude_blocked_inactive_and_other_profiles(engine):
    await make_preset(engine, preset_id=1)
    await make_preset(engine, preset_id=2, visibility="PRIVATE_ONLY")
    await make_preset(engine, preset_id=3, visibility="BLOCKED")
    await make_preset(engine, preset_id=4, is_active=False)
    await make_preset(engine, preset_id=5, profile="other-model-1536-cosine-v1")
    async with engine.connect() as conn:
        presets = await keyword_preset.load_usable(conn, PROFILE)
    assert [preset.id for preset in presets] == [1, 2]
    assert presets[0].examples == ("예시 하나", "예시 둘", "예시 셋")
    assert presets[0].embedding.shape == (1536,)


async def test_fingerprint_detects_a_different_text_or_owner_for_the_same_context(engine):
    first = hashlib.sha256("조용한 카페".encode()).digest()
    other = hashlib.sha256("시끄러운 술집".encode()).digest()

    async def record(text_sha256: bytes, user_id: int = 7, record_id: int = 70):
        async with engine.begin() as conn:
            return await context_text_fingerprint.record(
                conn, context_id=1, user_id=user_id, record_id=record_id, text_sha256=text_sha256
            )

    assert await record(first) == FingerprintMatch(same_text=True, same_owner=True)
    assert await record(first) == FingerprintMatch(same_text=True, same_owner=True)
    assert await record(other) == FingerprintMatch(same_text=False, same_owner=True)
    assert await record(first, user_id=8) == FingerprintMatch(same_text=True, same_owner=False)
    assert await record(first, record_id=71) == FingerprintMatch(same_text=True, same_owner=False)
    # The first request stays the reference.
    assert await record(first) == FingerprintMatch(same_text=True, same_owner=True)
