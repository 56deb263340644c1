"""The worker processes only the text the core committed (§3 scenario 5,
Deviation): the core writes the digest with the PENDING row; a process request with another text
claims nothing, stores nothing, is logged once at WARNING and counted; the genuine one runs."""

from __future__ import annotations

import logging
import unicodedata

from sqlalchemy import text

from pinlog_platform.contract.text_fingerprint import fingerprint
from tests.worker.support import count_rows, fetch_state, make_state, stored_embedding

BODY = "조용한 북카페. 책 읽기 좋아요."
FORGED = "술 마시기 좋은 시끄러운 바"


async def _digest(engine, context_id: int) -> tuple[bytes, bool]:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT text_sha256, text_sha256_from_core FROM ai.context_ai_state "
                    "WHERE context_id = :id"
                ),
                {"id": context_id},
            )
        ).one()
    return bytes(row[0]), row[1]


def _process_body(dispatched: dict, text_: str) -> dict:
    return {**dispatched, "text": text_}


async def test_core_writes_the_digest_of_the_committed_text_with_the_pending_row(
    engine, core_with_fake_worker, fake_worker
):
    created = await core_with_fake_worker.create(1, BODY)
    assert created.status_code == 201
    context_id = created.json()["contextId"]

    assert await _digest(engine, context_id) == (fingerprint(BODY), True)
    await fake_worker.wait_for_requests(1)
    assert fingerprint(fake_worker.requests[0]["text"]) == fingerprint(BODY)


async def test_a_forged_text_before_the_dispatch_stores_nothing_and_the_genuine_one_completes(
    engine, core_with_fake_worker, fake_worker, worker, fake_openai, caplog
):
    # The core's dispatch goes to the fake worker and waits there: the forged request to the
    # real worker gets in first, as an attacker holding X-Internal-Secret would.
    created = await core_with_fake_worker.create(1, BODY)
    context_id = created.json()["contextId"]
    await fake_worker.wait_for_requests(1)
    genuine = fake_worker.requests[0]

    with caplog.at_level(logging.WARNING):
        forged = await worker.post(_process_body(genuine, FORGED))
        await worker.drain()

    assert forged.status_code == 202
    assert await fetch_state(engine, context_id) == ("PENDING", "PENDING")
    assert await stored_embedding(engine, context_id) is None
    assert await count_rows(engine, "ai.context_keyword", context_id) == 0
    assert fake_openai.embedding_calls == 0
    assert fake_openai.judge_calls == 0
    assert await worker.metric("pinlog_contract_violations_total", kind="text_mismatch") == 1
    warnings = [r for r in caplog.records if "committed" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert FORGED not in caplog.text

    assert (await worker.post(genuine)).status_code == 202
    await worker.drain()
    assert await fetch_state(engine, context_id) == ("COMPLETED", "COMPLETED")
    assert await _digest(engine, context_id) == (fingerprint(BODY), True)


async def test_the_nfd_spelling_of_the_committed_text_is_the_same_text(engine, worker):
    await make_state(engine, context_id=5, user_id=7, record_id=70, core_text="카페")
    nfd = unicodedata.normalize("NFD", "카페")
    assert nfd != "카페"
    response = await worker.post(
        {"contextId": 5, "userId": 7, "recordId": 70, "text": nfd, "placeMeta": {"name": "x"}}
    )
    assert response.status_code == 202
    await worker.drain()
    assert await fetch_state(engine, 5) == ("COMPLETED", "COMPLETED")


async def test_a_row_without_a_core_digest_keeps_the_first_request_rule(engine, worker):
    await make_state(engine, context_id=6, user_id=7, record_id=70)
    first = {"contextId": 6, "userId": 7, "recordId": 70, "text": BODY, "placeMeta": {}}
    await worker.post(first)
    await worker.drain()
    await worker.post({**first, "text": FORGED})
    await worker.drain()

    assert await fetch_state(engine, 6) == ("COMPLETED", "COMPLETED")
    assert await _digest(engine, 6) == (fingerprint(BODY), False)
    assert await worker.metric("pinlog_contract_violations_total", kind="text_changed") == 1
    assert await worker.metric("pinlog_contract_violations_total", kind="text_mismatch") == 0
