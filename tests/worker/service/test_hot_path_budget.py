"""What one context costs: statements on the worker's engine, and embedding stages
coalesced into shared provider requests. Real worker, real database, real fake provider.
"""

from __future__ import annotations

import asyncio

from sqlalchemy import event

from tests.fake_openai import Scripted
from tests.worker.service.test_input_faults import CONTEXT_LENGTH
from tests.worker.support import fetch_state, make_state

NOTE = "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음."
NOTES = [
    "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음.",
    "친구들이랑 저녁 먹기 좋은 시끄러운 술집.",
    "비 오는 날 창가 자리에서 책 읽기 좋은 곳.",
]


async def test_a_happy_path_context_costs_three_statements(engine, worker, fake_openai):
    """Start (pre-check + owner + embedding claim), embedding save (+ keyword claim) and
    keyword save: one statement each on the stage pool, each its own implicit transaction,
    and nothing on the worker's SQLAlchemy engine (no pings, no reads)."""
    for context_id in (1, 2):
        await make_state(engine, context_id=context_id)
    await worker.process(1, NOTE)  # warm: connections opened, statements prepared
    engine_statements: list[str] = []

    def record(_conn, _cursor, statement, _parameters, _context, _executemany) -> None:
        engine_statements.append(" ".join(statement.split()[:4]))

    stage_pool = worker.app.state.stage_pool
    worker_engine = worker.app.state.engine.sync_engine
    before = stage_pool.statements_run
    event.listen(worker_engine, "before_cursor_execute", record)
    try:
        await worker.process(2, NOTE)
    finally:
        event.remove(worker_engine, "before_cursor_execute", record)

    assert await fetch_state(engine, 2) == ("COMPLETED", "COMPLETED")
    assert fake_openai.judge_calls == 2  # the judge ran: the full keyword path was measured
    assert stage_pool.statements_run - before == 3
    assert engine_statements == []


async def test_concurrent_embedding_stages_share_one_provider_request(
    engine, make_worker, fake_openai
):
    for context_id in (1, 2, 3):
        await make_state(engine, context_id=context_id)
    # A full batch is sent at once; the long wait only makes the test independent of timing.
    async with make_worker(embedding_batch_size=3, embedding_batch_wait_ms=1000) as worker:
        await asyncio.gather(*(worker.process(i + 1, note) for i, note in enumerate(NOTES)))

    assert fake_openai.embedding_calls == 1
    assert [len(r["input"]) for r in fake_openai.embedding_requests] == [3]
    for context_id in (1, 2, 3):
        assert await fetch_state(engine, context_id) == ("COMPLETED", "COMPLETED")


async def test_an_input_refused_in_a_batch_fails_only_its_own_stage(
    engine, make_worker, fake_openai
):
    """A 400 context_length_exceeded of the batched request is resolved input by input:
    the inputs are sent alone, and only the one the provider refuses again fails."""
    for context_id in (1, 2, 3):
        await make_state(engine, context_id=context_id)
    fake_openai.script_embeddings(
        Scripted(status=400, json=CONTEXT_LENGTH), Scripted(status=400, json=CONTEXT_LENGTH)
    )
    async with make_worker(embedding_batch_size=3, embedding_batch_wait_ms=1000) as worker:
        await asyncio.gather(*(worker.process(i + 1, note) for i, note in enumerate(NOTES)))

    assert fake_openai.embedding_calls == 4  # the batch, then each input alone
    states = [await fetch_state(engine, context_id) for context_id in (1, 2, 3)]
    assert sorted(states) == [
        ("COMPLETED", "COMPLETED"),
        ("COMPLETED", "COMPLETED"),
        ("FAILED", "PENDING"),
    ]
