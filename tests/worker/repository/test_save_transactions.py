"""The two saves of §3 (one statement each) against concurrent cancellations (scenarios 10,
11, 12), reclaims (the attempt) and the keyword claim folded into the embedding save."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from app.errors import DatabaseStatementError
from app.repository import context_ai_state, stage_saves
from pinlog_platform.contract.states import Stage
from tests.worker.open_transactions import (
    cancel_context,
    cancelled_in_open_transaction,
    finished_behind_lock,
)
from tests.worker.support import (
    PROFILE,
    count_rows,
    fetch_state,
    make_embedding,
    make_preset,
    make_state,
    vector,
)


async def save_embedding(stage_pool, context_id: int = 1, attempt: int = 1) -> bool:
    saved = await stage_saves.save_embedding(
        stage_pool,
        context_id=context_id,
        attempt=attempt,
        user_id=7,
        record_id=70,
        embedding=vector(context_id),
        embedding_profile=PROFILE,
    )
    return saved is not None


async def save_keywords(
    stage_pool, context_id: int = 1, selections=((1, 0.9),), attempt: int = 1, model="judge-x"
) -> bool:
    return await stage_saves.save_keywords(
        stage_pool,
        context_id=context_id,
        attempt=attempt,
        selections=list(selections),
        preset_version=3,
        unmatched_concepts=["주차"],
        model_profile=model,
        embedding_profile=PROFILE,
    )


async def claim(stage_pool, stage: Stage, context_id: int = 1):
    return await context_ai_state.claim(stage_pool, stage, context_id, expiry_seconds=600)


async def test_embedding_save_stores_vector_and_completes(engine, stage_pool):
    await make_state(engine, context_id=1)
    await claim(stage_pool, Stage.EMBEDDING)

    assert await save_embedding(stage_pool) is True

    # The same statement started the keyword stage (§2: it needs embedding COMPLETED).
    assert await fetch_state(engine, 1) == ("COMPLETED", "PROCESSING")
    async with engine.connect() as conn:
        row = (await conn.execute(text("SELECT * FROM ai.context_embedding"))).one()
    assert (row.user_id, row.record_id, row.embedding_profile, row.is_deleted) == (
        7,
        70,
        PROFILE,
        False,
    )
    assert row.embedding.to_numpy().shape == (1536,)


async def test_scenario_10_12_embedding_save_after_cancel_is_discarded_and_writes_no_row(
    engine, stage_pool
):
    await make_state(engine, context_id=1)
    await claim(stage_pool, Stage.EMBEDDING)
    await cancel_context(engine, context_id=1)  # delete before any embedding row exists

    assert await save_embedding(stage_pool) is False

    assert await count_rows(engine, "ai.context_embedding", 1) == 0
    assert await fetch_state(engine, 1) == ("CANCELLED", "CANCELLED")


async def test_embedding_save_without_claim_is_discarded(engine, stage_pool):
    await make_state(engine, context_id=1)
    assert await save_embedding(stage_pool) is False
    assert await count_rows(engine, "ai.context_embedding", 1) == 0


async def test_embedding_save_without_state_row_is_discarded(engine, stage_pool):
    assert await save_embedding(stage_pool, context_id=99) is False
    assert await count_rows(engine, "ai.context_embedding", 99) == 0


async def test_embedding_upsert_keeps_is_deleted_true(engine, stage_pool):
    # A row the core side already marked deleted, then a reclaimed stage saves again; a
    # vector of another profile (a switch, 0060) is a row of its own and stays as it was.
    await make_state(engine, context_id=1, embedding_status="PROCESSING")
    await make_embedding(engine, context_id=1, is_deleted=True, profile=PROFILE)
    await make_embedding(
        engine, context_id=1, is_deleted=True, profile="old-profile-1536-cosine-v1"
    )

    # A row moved to PROCESSING by hand has never been claimed: attempt 0.
    assert await save_embedding(stage_pool, attempt=0) is True

    async with engine.connect() as conn:
        rows = (
            await conn.execute(
                text(
                    "SELECT embedding_profile, is_deleted FROM ai.context_embedding "
                    "ORDER BY embedding_profile"
                )
            )
        ).all()
    assert [(r.embedding_profile, r.is_deleted) for r in rows] == [
        (PROFILE, True),
        ("old-profile-1536-cosine-v1", True),
    ]


async def test_save_waiting_on_a_cancelling_transaction_sees_cancelled_and_discards(
    engine, stage_pool
):
    await make_state(engine, context_id=1)
    await claim(stage_pool, Stage.EMBEDDING)

    async with cancelled_in_open_transaction(engine, 1) as cancelling:
        outcome = await finished_behind_lock(engine, save_embedding(stage_pool), cancelling.commit)

    assert outcome is False
    assert await count_rows(engine, "ai.context_embedding", 1) == 0


async def test_cancel_waiting_on_a_save_wins_afterwards(engine, stage_pool):
    # The opposite order: the save holds the lock first, the cancellation lands after it.
    await make_state(engine, context_id=1)
    await claim(stage_pool, Stage.EMBEDDING)
    assert await save_embedding(stage_pool) is True
    await cancel_context(engine, context_id=1)
    assert await fetch_state(engine, 1) == ("CANCELLED", "CANCELLED")
    async with engine.connect() as conn:
        deleted = (await conn.execute(text("SELECT is_deleted FROM ai.context_embedding"))).one()
    assert deleted.is_deleted is True


async def test_keyword_save_replaces_rows_and_writes_analysis(engine, stage_pool):
    for preset_id in (1, 2, 3):
        await make_preset(engine, preset_id=preset_id)
    await make_state(engine, context_id=1, embedding_status="COMPLETED")
    await claim(stage_pool, Stage.KEYWORD)

    assert await save_keywords(stage_pool, selections=[(1, 0.9), (2, 0.5), (3, 0.25)]) is True
    assert await count_rows(engine, "ai.context_keyword", 1) == 3
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    async with engine.connect() as conn:
        analysis = (await conn.execute(text("SELECT * FROM ai.context_keyword_analysis"))).one()
    assert analysis.unmatched_concepts == ["주차"]
    assert (analysis.preset_version, analysis.model_profile) == (3, "judge-x")


async def test_keyword_save_stores_the_candidates_in_the_same_statement(engine, stage_pool):
    """§4 Addition "candidates kept": the pairs the judge chose among, best first, 3 decimals,
    replaced by the next judgment (``[]`` for none)."""
    for preset_id in (1, 2, 3):
        await make_preset(engine, preset_id=preset_id)
    await make_state(engine, context_id=1, embedding_status="COMPLETED")
    await claim(stage_pool, Stage.KEYWORD)
    offered = [(2, 0.61234), (1, 0.5), (3, 0.40049)]
    saved = await stage_saves.save_keywords(
        stage_pool, context_id=1, attempt=1, selections=[(2, 0.9)], preset_version=3,
        unmatched_concepts=[], model_profile="judge-x", embedding_profile=PROFILE,
        candidates=offered,
    )  # fmt: skip
    assert saved is True
    async with engine.connect() as conn:
        stored = await conn.execute(text("SELECT candidates FROM ai.context_keyword_analysis"))
        assert stored.scalar_one() == [[2, 0.612], [1, 0.5], [3, 0.4]]
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE ai.context_ai_state SET keyword_status = 'PENDING'"))
    await claim(stage_pool, Stage.KEYWORD)

    assert await save_keywords(stage_pool, selections=[], attempt=2) is True

    async with engine.connect() as conn:
        stored = await conn.execute(text("SELECT candidates FROM ai.context_keyword_analysis"))
        assert stored.scalar_one() == []


async def test_keyword_delete_insert_replaces_three_rows_with_zero(engine, stage_pool):
    for preset_id in (1, 2, 3):
        await make_preset(engine, preset_id=preset_id)
    await make_state(engine, context_id=1, embedding_status="COMPLETED")
    await claim(stage_pool, Stage.KEYWORD)
    await save_keywords(stage_pool, selections=[(1, 0.9), (2, 0.5), (3, 0.25)])
    # A re-judgment (operator reset to PENDING, then claimed again) that selects nothing.
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE ai.context_ai_state SET keyword_status = 'PENDING'"))
    await claim(stage_pool, Stage.KEYWORD)

    assert await save_keywords(stage_pool, selections=[], attempt=2) is True

    assert await count_rows(engine, "ai.context_keyword", 1) == 0
    assert await count_rows(engine, "ai.context_keyword_analysis", 1) == 1
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")


async def test_scenario_11_keyword_save_after_cancel_is_discarded_and_writes_no_row(
    engine, stage_pool
):
    await make_preset(engine, preset_id=1)
    await make_state(engine, context_id=1, embedding_status="COMPLETED")
    await claim(stage_pool, Stage.KEYWORD)
    await cancel_context(engine, context_id=1)

    assert await save_keywords(stage_pool) is False

    assert await count_rows(engine, "ai.context_keyword", 1) == 0
    assert await count_rows(engine, "ai.context_keyword_analysis", 1) == 0


async def test_keyword_save_refuses_when_embedding_is_not_completed(engine, stage_pool):
    await make_preset(engine, preset_id=1)
    await make_state(
        engine, context_id=1, embedding_status="PROCESSING", keyword_status="PROCESSING"
    )

    assert await save_keywords(stage_pool) is False

    assert await count_rows(engine, "ai.context_keyword", 1) == 0
    assert await fetch_state(engine, 1) == ("PROCESSING", "PROCESSING")


async def test_keyword_save_waiting_on_a_cancelling_transaction_discards(engine, stage_pool):
    await make_preset(engine, preset_id=1)
    await make_state(engine, context_id=1, embedding_status="COMPLETED")
    await claim(stage_pool, Stage.KEYWORD)

    async with cancelled_in_open_transaction(engine, 1) as cancelling:
        outcome = await finished_behind_lock(engine, save_keywords(stage_pool), cancelling.commit)

    assert outcome is False
    assert await count_rows(engine, "ai.context_keyword", 1) == 0
    assert await count_rows(engine, "ai.context_keyword_analysis", 1) == 0


async def test_database_errors_never_carry_statement_parameters(engine, stage_pool):
    """Parameters hold vectors and model output; exception text reaches logs (§6)."""
    await make_preset(engine, preset_id=1)
    await make_state(engine, context_id=1, embedding_status="COMPLETED")
    await claim(stage_pool, Stage.KEYWORD)
    marker = "모델출력-marker-zqx9"
    with pytest.raises(DatabaseStatementError) as raised:
        await stage_saves.save_keywords(
            stage_pool,
            context_id=1,
            attempt=1,
            selections=[(1, 0.9)],
            preset_version=1,
            unmatched_concepts=[marker],
            model_profile=marker * 10,  # VARCHAR(100)
            embedding_profile=PROFILE,
        )
    assert "SQLSTATE 22001" in str(raised.value)  # string_data_right_truncation
    # A traceback in the log never prints the driver's exception (its text can quote values).
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
    assert marker not in str(raised.value)
    assert await count_rows(engine, "ai.context_keyword", 1) == 0


async def test_embedding_save_also_starts_a_pending_keyword_stage(engine, stage_pool):
    await make_preset(engine, preset_id=1)
    await make_state(engine, context_id=1)
    await claim(stage_pool, Stage.EMBEDDING)
    saved = await stage_saves.save_embedding(
        stage_pool,
        context_id=1,
        attempt=1,
        user_id=7,
        record_id=70,
        embedding=vector(1),
        embedding_profile=PROFILE,
    )
    assert saved == stage_saves.EmbeddingSaved(keyword_attempt=1)
    assert await fetch_state(engine, 1) == ("COMPLETED", "PROCESSING")
    assert await save_keywords(stage_pool, attempt=1) is True
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")


async def test_keyword_save_replaces_an_overlapping_set_in_one_statement(engine, stage_pool):
    for preset_id in (1, 2, 3):
        await make_preset(engine, preset_id=preset_id)
    await make_state(engine, context_id=1, embedding_status="COMPLETED")
    await claim(stage_pool, Stage.KEYWORD)
    await save_keywords(stage_pool, selections=[(1, 0.9), (2, 0.5)])
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE ai.context_ai_state SET keyword_status = 'PENDING'"))
    await claim(stage_pool, Stage.KEYWORD)

    # Keyword 2 is kept (deleted and inserted again in the same statement), 1 goes, 3 comes.
    assert await save_keywords(stage_pool, selections=[(2, 0.4), (3, 0.3)], attempt=2) is True

    async with engine.connect() as conn:
        rows = (
            await conn.execute(
                text("SELECT keyword_id, confidence FROM ai.context_keyword ORDER BY keyword_id")
            )
        ).all()
    assert [(r.keyword_id, float(r.confidence)) for r in rows] == [(2, 0.4), (3, 0.3)]
