"""One hard deadline per stage, from the claim to the save (§2, §6, §10 #9).

Expiry 2 s makes the deadline 1.8 s (``failure_policy.STAGE_DEADLINE_FRACTION``). Settings that
pass the startup check (provider timeout 0.9 s x 2 attempts < 2 s) still let waits the check
cannot see run long: the SDK's ``Retry-After`` sleep, a row lock held elsewhere. The deadline
abandons the stage before the expiry: left ``PROCESSING``, one WARNING, nothing stored.
"""

from __future__ import annotations

import asyncio
import logging
import time

from sqlalchemy import text

from app import failure_policy
from tests.fake_openai import Scripted
from tests.worker.support import (
    app_records,
    backdate,
    count_rows,
    fetch_state,
    make_state,
    release,
    start_held,
)

NOTE = "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음."
EXPIRY_SECONDS = 2
DEADLINE_SECONDS = failure_policy.stage_deadline_seconds(EXPIRY_SECONDS)
SHORT_EXPIRY = {
    "processing_expiry_seconds": EXPIRY_SECONDS,
    "provider_timeout_seconds": 0.9,
    "provider_max_retries": 1,
}
LOCK_STATE_ROW = text("SELECT 1 FROM ai.context_ai_state WHERE context_id = :id FOR UPDATE")


def _deadline_warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in app_records(caplog, logging.WARNING)
        if "cause=StageDeadlineExceeded" in r.getMessage()
    ]


async def test_retry_after_sleep_inside_the_sdk_is_cut_by_the_stage_deadline(
    engine, make_worker, fake_openai, caplog
):
    """A 429 with ``Retry-After: 5`` makes the SDK sleep 5 s before its retry: the keyword
    stage is abandoned at 1.8 s, still ``PROCESSING``, one judge call; after the expiry the
    rescan's request reclaims it and completes with exactly one more call."""
    fake_openai.script_judge(Scripted(status=429, headers={"Retry-After": "5"}))
    await make_state(engine, context_id=1)
    async with make_worker(**SHORT_EXPIRY) as worker:
        started = time.monotonic()
        await worker.process(1, NOTE)
        elapsed = time.monotonic() - started

        assert DEADLINE_SECONDS <= elapsed < EXPIRY_SECONDS
        assert await fetch_state(engine, 1) == ("COMPLETED", "PROCESSING")
        assert fake_openai.judge_calls == 1
        assert await count_rows(engine, "ai.context_keyword_analysis", 1) == 0
        (warning,) = _deadline_warnings(caplog)
        assert "context_id=1 stage=keyword" in warning
        assert f"stage deadline of {DEADLINE_SECONDS:g} s exceeded" in warning
        assert not app_records(caplog, logging.ERROR)
        # The abandoned judge call is "cancelled", not a provider error.
        assert await worker.metric("pinlog_stage_deadlines_exceeded_total", stage="keyword") == 1
        assert (
            await worker.metric("pinlog_stage_outcomes_total", stage="keyword", outcome="transient")
            == 1
        )
        judge_calls = "pinlog_provider_call_seconds_count"
        assert await worker.metric(judge_calls, provider="judge", outcome="cancelled") == 1
        assert await worker.metric(judge_calls, provider="judge", outcome="error") == 0

        # The 429 also cooled the judge down for its Retry-After (rate budgets): the gate says
        # rate_limited until then, and a call before it would wait for the cooldown.
        gate = worker.app.state.gates["judge"]
        assert gate.reason == "rate_limited"
        for _ in range(100):
            if gate.available:
                break
            await asyncio.sleep(0.1)
        await backdate(engine, 1, seconds=EXPIRY_SECONDS + 1)
        await worker.process(1, NOTE)

        assert await worker.metric("pinlog_reclaims_total", stage="keyword") == 1
        assert await worker.metric(judge_calls, provider="judge", outcome="ok") == 1

    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert fake_openai.judge_calls == 2


async def test_a_save_waiting_on_a_row_lock_is_cut_by_the_deadline_and_rolls_back(
    engine, make_worker, fake_openai, hold, caplog
):
    """The embedding save waits on ``FOR UPDATE`` behind another session (``lock_timeout`` is
    3 s, longer than the deadline): cut by the command deadline, nothing stored, still
    ``PROCESSING``; the worker then serves the next context normally."""
    await make_state(engine, context_id=1)
    await make_state(engine, context_id=2)
    # The lock must be in place before the held embedding call times out (after that the
    # retry is answered at once and the save finds no lock): the blocker's transaction is
    # open beforehand, and this worker's provider timeout leaves seconds for one statement
    # on a loaded machine (the command deadline, 0.9 x 8 / 4 = 1.8 s, still ends the wait
    # before lock_timeout's 3 s).
    lock_wait = {"processing_expiry_seconds": 8, "provider_timeout_seconds": 3.5}
    async with make_worker(**{**SHORT_EXPIRY, **lock_wait}) as worker, engine.connect() as blocker:
        transaction = await blocker.begin()
        held = hold()
        task = await start_held(worker, fake_openai.script_embeddings, held, 1, NOTE)
        await blocker.execute(LOCK_STATE_ROW, {"id": 1})
        release(held)
        await asyncio.wait_for(task, 20)
        await transaction.rollback()

        assert await fetch_state(engine, 1) == ("PROCESSING", "PENDING")
        assert await count_rows(engine, "ai.context_embedding", 1) == 0
        # The command deadline (a quarter of the stage deadline, the server's
        # statement_timeout) cuts the wait first: a transient fault, the row left for the
        # rescan.
        warnings = [r.getMessage() for r in app_records(caplog, logging.WARNING)]
        assert any("context_id=1 stage=embedding" in m and "transient" in m for m in warnings), (
            warnings
        )

        await worker.process(2, NOTE)

    assert await fetch_state(engine, 2) == ("COMPLETED", "COMPLETED")
