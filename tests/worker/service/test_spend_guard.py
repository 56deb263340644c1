"""The spend guard: a daily token cap closes that provider's gate until the next
UTC day; process requests are refused at accept time with 503 and ``Retry-After``, nothing is
``FAILED``, ``/readyz`` and the metrics show it, and a raised cap releases the work.
"""

from __future__ import annotations

import logging

from sqlalchemy import text

from app.repository.usage_ledger import UsageDelta, add_usage, tokens_today
from tests.fake_openai import Scripted
from tests.worker.harness import SECRET
from tests.worker.support import fetch_state, make_state

HEADERS = {"X-Internal-Secret": SECRET}
NOTE = "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음."
DAY = 86_400


def _body(context_id: int) -> dict[str, object]:
    return {"contextId": context_id, "userId": 7, "recordId": context_id, "text": NOTE}


async def _post(worker, context_id: int):
    return await worker.client.post(
        "/internal/v1/context/process", json=_body(context_id), headers=HEADERS
    )


async def _failed_stages(engine) -> int:
    async with engine.connect() as conn:
        return (
            await conn.execute(
                text(
                    "SELECT count(*) FROM ai.context_ai_state "
                    "WHERE embedding_status = 'FAILED' OR keyword_status = 'FAILED'"
                )
            )
        ).scalar_one()


async def test_a_reached_cap_refuses_work_without_failing_it_until_the_cap_is_raised(
    engine, make_worker, fake_openai, caplog
):
    for context_id in (1, 2):
        await make_state(engine, context_id=context_id)
    caplog.set_level(logging.ERROR, logger="app.service.spend_guard")

    async with make_worker(judge_daily_token_cap=10) as worker:
        assert (await _post(worker, 1)).status_code == 202  # 0 of 10 spent: it runs
        await worker.drain()
        assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")

        refused = await _post(worker, 2)
        ready = (await worker.client.get("/readyz")).json()
        capped = await worker.metric("pinlog_provider_spend_capped", provider="judge")
        embedding_capped = await worker.metric("pinlog_provider_spend_capped", provider="embedding")
        gate_reason = await worker.metric(
            "pinlog_provider_unavailable", provider="judge", reason="daily_token_cap"
        )
        embedding_gate_reason = await worker.metric(
            "pinlog_provider_unavailable", provider="embedding", reason="daily_token_cap"
        )
        caps = [
            await worker.metric("pinlog_provider_daily_token_cap", provider=provider)
            for provider in ("judge", "embedding")
        ]
        judge_tokens = await worker.metric("pinlog_provider_tokens_today", provider="judge")

    assert refused.status_code == 503
    assert refused.json() == {"detail": "judge provider unavailable"}
    assert 1 <= int(refused.headers["Retry-After"]) <= DAY
    assert ready["providers"]["judge"]["available"] is False
    assert ready["providers"]["judge"]["reason"] == "daily_token_cap"
    assert ready["providers"]["embedding"]["available"] is True, "the other provider is open"
    assert (capped, embedding_capped) == (1, 0)
    assert (gate_reason, embedding_gate_reason) == (1, 0)
    assert caps == [10, 0]
    assert judge_tokens is not None and judge_tokens >= 10, "what closed the gate"
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "judge provider daily token cap reached" in errors[0].message
    assert await fetch_state(engine, 2) == ("PENDING", "PENDING")
    assert await _failed_stages(engine) == 0

    # A restart with the same cap: today's tokens are read from the ledger at startup.
    async with make_worker(judge_daily_token_cap=10) as worker:
        assert (await _post(worker, 2)).status_code == 503
    # The operator raises the cap: the refused work runs.
    async with make_worker(judge_daily_token_cap=1_000_000) as worker:
        assert (await _post(worker, 2)).status_code == 202
        await worker.drain()
    assert await fetch_state(engine, 2) == ("COMPLETED", "COMPLETED")
    assert await _failed_stages(engine) == 0


async def test_an_embedding_cap_leaves_running_stages_processing_never_failed(
    engine, make_worker, fake_openai
):
    for context_id in (1, 2):
        await make_state(engine, context_id=context_id)
    async with make_worker(
        embedding_daily_token_cap=1, refuse_while_provider_unavailable=False
    ) as worker:
        assert (await _post(worker, 1)).status_code == 202
        await worker.drain()
        # Accepted (refusals off), but the capped gate makes no call: transient.
        assert (await _post(worker, 2)).status_code == 202
        await worker.drain()
        calls = fake_openai.embedding_calls

    assert calls == 1
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert (await fetch_state(engine, 2))[0] in ("PENDING", "PROCESSING")
    assert await _failed_stages(engine) == 0


async def test_tokens_billed_for_failed_attempts_count_toward_the_cap(
    engine, make_worker, fake_openai
):
    """A provider that bills failed requests (its 503 body reports ``usage``: 40 tokens) and
    2 retries per call: one embedding call spends 120 tokens over its three wire requests.
    With a cap of 100 the embedding gate closes after that call: the next request is refused
    (503, reason ``daily_token_cap``) and the first note is left for the rescan, not FAILED."""
    for context_id in (1, 2):
        await make_state(engine, context_id=context_id)
    billed = {
        "error": {"message": "busy", "type": "server_error", "code": None, "param": None},
        "usage": {"prompt_tokens": 40, "total_tokens": 40},
    }
    async with make_worker(embedding_daily_token_cap=100, provider_max_retries=2) as worker:
        fake_openai.set_fault("embeddings", Scripted(status=503, json=billed))
        before = fake_openai.embedding_calls
        assert (await _post(worker, 1)).status_code == 202
        await worker.drain()
        requests = fake_openai.embedding_calls - before
        refused = await _post(worker, 2)
        ready = (await worker.client.get("/readyz")).json()

    assert requests == 3, "one call, two retries"
    assert refused.status_code == 503
    assert ready["providers"]["embedding"]["reason"] == "daily_token_cap"
    assert (await fetch_state(engine, 1))[0] in ("PENDING", "PROCESSING")
    assert await fetch_state(engine, 2) == ("PENDING", "PENDING")
    assert await _failed_stages(engine) == 0


async def test_tokens_today_count_every_process_from_the_ledger_without_a_cap(
    engine, make_worker, fake_openai
):
    """``pinlog_provider_tokens_today``: every process's tokens of the UTC day (the ledger,
    read at startup and after each write) plus this process's calls since, also where no cap
    is set (the alerts on 80 % of a cap read it beside ``pinlog_provider_daily_token_cap``)."""
    await make_state(engine, context_id=1)
    another_process = UsageDelta(
        "judge", "gpt-4o-mini", "keyword", calls=3, prompt_tokens=900, completion_tokens=60,
        embedding_tokens=0, estimated_tokens=0, cost_usd=None,
    )  # fmt: skip
    async with engine.begin() as conn:
        await add_usage(conn, [another_process])

    async with make_worker() as worker:
        at_start = await worker.metric("pinlog_provider_tokens_today", provider="judge")
        cap = await worker.metric("pinlog_provider_daily_token_cap", provider="judge")
        assert (await _post(worker, 1)).status_code == 202
        await worker.drain()
        after_a_note = await worker.metric("pinlog_provider_tokens_today", provider="judge")
        await worker.app.state.usage.flush()
        after_the_write = await worker.metric("pinlog_provider_tokens_today", provider="judge")
    async with engine.connect() as conn:
        ledger = await tokens_today(conn, "judge")

    assert (at_start, cap) == (960, 0)
    assert after_a_note is not None and after_a_note > 960, "this process's call, at once"
    assert after_the_write == ledger == after_a_note, "written and read back: counted once"
