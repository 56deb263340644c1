"""Hostile HTTP inputs to the internal API (CONTRACT §3, §7, §8, FC-09, FC-11).

Every malformed body must be refused without a 5xx and without queueing anything; only the
exact ``/internal/v1/context/process`` route may accept work, and never without the secret.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.worker.harness import SECRET
from tests.worker.support import count_rows, fetch_state, make_state, post_raw

TEXT = "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음."
FINGERPRINTS = "ai.context_text_fingerprint"


async def _nothing_queued(engine, worker, fake_openai, context_id: int = 1) -> None:
    await worker.drain()
    assert await fetch_state(engine, context_id) == ("PENDING", "PENDING")
    assert await count_rows(engine, FINGERPRINTS, context_id) == 0
    assert fake_openai.embedding_calls == 0


NOT_AN_OBJECT = {
    "list": '[1, 7, 70, "x"]',
    "number": "1",
    "string": '"hello"',
    "null": "null",
    "true": "true",
    "empty_object": "{}",
    "truncated": '{"contextId": 1, "userId"',
    "nan_id": '{"contextId": NaN, "userId": 1, "recordId": 1, "text": "x"}',
    "infinity_id": '{"contextId": Infinity, "userId": 1, "recordId": 1, "text": "x"}',
    "id_1e0": '{"contextId": 1e0, "userId": 1, "recordId": 1, "text": "x"}',
    "id_1_0": '{"contextId": 1.0, "userId": 1, "recordId": 1, "text": "x"}',
    "id_string": '{"contextId": "1", "userId": 1, "recordId": 1, "text": "x"}',
    "id_true": '{"contextId": true, "userId": 1, "recordId": 1, "text": "x"}',
    "id_5000_digits": '{"contextId": ' + "9" * 5000 + ', "userId": 1, "recordId": 1, "text": "x"}',
    "text_number": '{"contextId": 1, "userId": 1, "recordId": 1, "text": 5}',
    "text_list": '{"contextId": 1, "userId": 1, "recordId": 1, "text": ["x"]}',
    "place_meta_nested_10k": '{"contextId": 1, "userId": 1, "recordId": 1, "text": '
    '"x", "placeMeta": ' + '{"a": ' * 10_000 + "1" + "}" * 10_000 + "}",
    "place_meta_array_100k": '{"contextId": 1, "userId": 1, "recordId": 1, "text": '
    '"x", "placeMeta": {"a": ' + "[" * 100_000 + "]" * 100_000 + "}}",
}


async def test_malformed_bodies_are_refused_with_4xx_never_5xx_and_queue_nothing(
    engine, worker, fake_openai
):
    """§8/FC-11: validation errors -> 422 (a JSON parser giving up may say 400, a body over
    the size cap 413); never a 500, nothing queued. One worker for every body keeps the test
    fast."""
    await make_state(engine, context_id=1)
    statuses = {}
    for name, raw in NOT_AN_OBJECT.items():
        statuses[name] = (await post_raw(worker, raw)).status_code
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        payload = json.dumps({"contextId": 1, "userId": 1, "recordId": 1, "text": TEXT})
        response = await worker.client.post(
            "/internal/v1/context/process",
            content=payload.encode(),
            headers={"X-Internal-Secret": SECRET, "Content-Type": content_type},
        )
        statuses[content_type] = response.status_code

    assert {name: s for name, s in statuses.items() if s not in (400, 413, 422)} == {}
    await _nothing_queued(engine, worker, fake_openai)


PATH_VARIANTS = (
    "/internal/v1/context/process/",
    "/internal/v1/context/process?x=1",
    "//internal/v1/context/process",
    "/internal//v1/context/process",
    "/internal/v1/context/../context/process",
    "/internal/v1/context/%70rocess",
    "/INTERNAL/v1/context/process",
    "/internal/v1/context/process%00",
)


async def test_no_path_variant_reaches_the_process_route_without_the_secret(
    engine, worker, fake_openai
):
    """§8: every /internal/* request needs X-Internal-Secret; a path trick must not bypass it."""
    await make_state(engine, context_id=1)
    payload = json.dumps({"contextId": 1, "userId": 1, "recordId": 1, "text": TEXT}).encode()
    statuses = {}
    for path in PATH_VARIANTS:
        response = await worker.client.post(
            path, content=payload, headers={"Content-Type": "application/json"}
        )
        statuses[path] = response.status_code

    assert {p: s for p, s in statuses.items() if s in (200, 202, 307, 308)} == {}
    await _nothing_queued(engine, worker, fake_openai)


async def test_duplicate_json_keys_last_one_wins_consistently(engine, worker, fake_openai):
    """§8: with duplicate JSON keys the last value wins: ``{"contextId": 2, ..., "contextId": 1}``
    processes context 1 only (RFC 8259 §4 leaves duplicates ambiguous)."""
    await make_state(engine, context_id=1)
    await make_state(engine, context_id=2)
    raw = (
        '{"contextId": 2, "userId": 1, "recordId": 1, "text": ' + json.dumps(TEXT) + ", "
        '"contextId": 1}'
    )

    response = await post_raw(worker, raw)
    await worker.drain()

    assert response.status_code == 202
    assert response.json() == {"contextId": 1}
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert await fetch_state(engine, 2) == ("PENDING", "PENDING")


async def _max_loop_stall(until: asyncio.Event) -> float:
    """Largest gap (seconds) between 5 ms ticks of this event loop until ``until`` is set."""
    worst = 0.0
    last = time.perf_counter()
    while not until.is_set():
        await asyncio.sleep(0.005)
        now = time.perf_counter()
        worst = max(worst, now - last)
        last = now
    return worst


@pytest.mark.serial  # a time bound that a loaded machine can miss
async def test_ten_megabyte_text_does_not_stall_the_event_loop(engine, make_worker, fake_openai):
    """FC-09, §6: a text far over ``embedding_max_input_chars`` is rejected by its length
    before any per-character scan: 202, embedding ``FAILED`` with no provider call, and the
    event loop never stalls for it (body cap raised to its 16 MiB maximum for this test)."""
    async with make_worker(max_request_bytes=16 * 1024 * 1024) as worker:
        await _ten_megabytes_without_a_stall(engine, worker, fake_openai)


async def _ten_megabytes_without_a_stall(engine, worker, fake_openai) -> None:
    await make_state(engine, context_id=1)
    huge = "a" * (10 * 1024 * 1024)
    payload = json.dumps({"contextId": 1, "userId": 1, "recordId": 1, "text": huge}).encode()
    headers = {"X-Internal-Secret": SECRET, "Content-Type": "application/json"}
    # The upload and JSON parsing are not what is measured: start the probe after the 202.
    response = await worker.client.post(
        "/internal/v1/context/process", content=payload, headers=headers
    )
    assert response.status_code == 202
    done = asyncio.Event()
    probe = asyncio.create_task(_max_loop_stall(done))
    await worker.drain()
    done.set()
    stall = await probe

    assert await fetch_state(engine, 1) == ("FAILED", "PENDING")
    assert fake_openai.embedding_calls == 0
    assert stall < 0.2, f"event loop blocked for {stall:.2f} s by one oversized text"
