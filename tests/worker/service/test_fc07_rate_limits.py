"""FC-07: 429 with Retry-After is retried inside one call only, within its budget (§6)."""

from __future__ import annotations

import logging
from itertools import pairwise

from tests.fake_openai import Scripted
from tests.worker.support import app_records, fetch_state, make_state

NOTE = "친구들이랑 수다 떨기 좋은 넓은 카페. 단체석 있음."
TOO_MANY = {"error": {"message": "rate limited", "type": "rate_limit_error"}}


async def test_fc07a_two_429s_with_retry_after_2_then_success_completes_in_3_calls(
    engine, make_worker, fake_openai, caplog
):
    retry = {"Retry-After": "2"}
    fake_openai.script_judge(
        Scripted(status=429, json=TOO_MANY, headers=retry),
        Scripted(status=429, json=TOO_MANY, headers=retry),
    )
    await make_state(engine, context_id=1)

    async with make_worker(provider_max_retries=2) as worker:
        await worker.process(1, NOTE)

    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    arrivals = fake_openai.judge_arrivals
    assert len(arrivals) == 3
    assert all(later - earlier >= 2.0 for earlier, later in pairwise(arrivals))
    assert not app_records(caplog, logging.ERROR)


async def test_fc07b_long_retry_after_gives_up_and_leaves_the_stage_for_the_rescan(
    engine, make_worker, fake_openai, caplog
):
    retry = {"Retry-After": "600"}
    fake_openai.script_judge(*(Scripted(status=429, json=TOO_MANY, headers=retry),) * 3)
    await make_state(engine, context_id=1)

    async with make_worker(provider_max_retries=2) as worker:
        await worker.process(1, NOTE)

    assert await fetch_state(engine, 1) == ("COMPLETED", "PROCESSING")
    assert fake_openai.judge_calls <= 3
    warnings = [r.getMessage() for r in app_records(caplog, logging.WARNING)]
    assert len(warnings) == 1
    assert "retry-after 600" in warnings[0]
    assert "context_id=1" in warnings[0]
    assert not app_records(caplog, logging.ERROR)
