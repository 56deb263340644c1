"""Starting a context (pre-check, owner and text checks, embedding claim) and preset loading
(§3.1, §2, §4, scenario 5)."""

from __future__ import annotations

import hashlib

import numpy as np

from app.repository import context_start, keyword_preset
from pinlog_platform.contract.preset_list import LIST_VERSION
from pinlog_platform.contract.states import Status
from tests.worker.support import (
    PROFILE,
    fetch_state,
    make_embedding,
    make_preset,
    make_state,
    vector,
)

QUIET = hashlib.sha256("조용한 카페".encode()).digest()
LOUD = hashlib.sha256("시끄러운 술집".encode()).digest()


async def start(stage_pool, *, text_sha256=QUIET, user_id=7, record_id=70, context_id=1):
    return await context_start.start(
        stage_pool,
        context_id=context_id,
        user_id=user_id,
        record_id=record_id,
        text_sha256=text_sha256,
        expiry_seconds=600,
        embedding_profile=PROFILE,
    )


async def test_start_of_a_completed_embedding_returns_the_stored_vector_and_claims_nothing(
    engine,
    stage_pool,
):
    await make_state(engine, context_id=1, embedding_status="COMPLETED")
    await make_embedding(engine, context_id=1, embedding=vector("x"))
    started = await start(stage_pool)
    assert started.embedding_status is Status.COMPLETED
    assert started.keyword_status is Status.PENDING
    assert started.embedding_attempt is None
    assert started.embedding_profile == PROFILE
    np.testing.assert_allclose(started.embedding, vector("x"), rtol=1e-6)


async def test_start_of_a_pending_context_claims_the_embedding_stage(engine, stage_pool):
    await make_state(engine, context_id=1)
    started = await start(stage_pool)
    assert (started.embedding_status, started.embedding_attempt) == (Status.PENDING, 1)
    assert started.embedding is None and not started.embedding_reclaimed
    assert await fetch_state(engine, 1) == ("PROCESSING", "PENDING")
    duplicate = await start(stage_pool)
    assert duplicate.embedding_attempt is None  # a fresh PROCESSING is not taken over


async def test_start_without_state_row_is_none(engine, stage_pool):
    assert await start(stage_pool) is None


async def test_usable_presets_exclude_blocked_inactive_and_other_profiles(engine):
    """Usable under a profile (pinlog_platform.contract.preset_list): active, not BLOCKED, with a
    vector
    of the profile embedded from the preset's current revision; the list version is the
    highest revision among them, the same for the worker's rows and the core's statement."""
    await make_preset(engine, preset_id=1, version=3)
    await make_preset(engine, preset_id=2, visibility="PRIVATE_ONLY", version=3)
    await make_preset(engine, preset_id=3, visibility="BLOCKED", version=4)
    await make_preset(engine, preset_id=4, is_active=False, version=4)
    await make_preset(engine, preset_id=5, profile="other-model-1536-cosine-v1", version=4)
    await make_preset(engine, preset_id=6, version=4, vector_version=3)  # stale vector
    await make_preset(engine, preset_id=7, profile=None, version=4)  # no vector at all
    async with engine.connect() as conn:
        presets = await keyword_preset.load_usable(conn, PROFILE)
        version = (await conn.execute(LIST_VERSION, {"profile": PROFILE})).scalar_one()
        other = (await conn.execute(LIST_VERSION, {"profile": "nobody"})).scalar_one()
    assert [preset.id for preset in presets] == [1, 2]
    assert (version, other) == (3, 0)
    assert presets[0].examples == ("예시 하나", "예시 둘", "예시 셋")
    assert presets[0].embedding.shape == (1536,)


async def test_the_first_claiming_request_is_the_reference_for_text_and_owner(engine, stage_pool):
    await make_state(engine, context_id=1)  # no owner from the core: the first request's

    first = await start(stage_pool)
    assert (first.same_text, first.same_owner, first.owner_from_core) == (True, True, False)
    assert (await start(stage_pool, text_sha256=LOUD)).same_text is False
    assert (await start(stage_pool, user_id=8)).same_owner is False
    assert (await start(stage_pool, record_id=71)).same_owner is False
    again = await start(stage_pool)  # the first request stays the reference
    assert (again.same_text, again.same_owner) == (True, True)


async def test_the_core_owner_is_the_reference_and_a_mismatch_claims_nothing(engine, stage_pool):
    await make_state(engine, context_id=1, user_id=7, record_id=70)

    wrong = await start(stage_pool, user_id=8)
    assert (wrong.same_owner, wrong.owner_from_core, wrong.embedding_attempt) == (False, True, None)
    assert await fetch_state(engine, 1) == ("PENDING", "PENDING")
    right = await start(stage_pool)
    assert (right.same_owner, right.embedding_attempt) == (True, 1)
