"""A worker that is down, hangs or answers 503 never turns a committed create or edit into a
failed or slow response (§9 "After-commit dispatch"): normal status within a second, the state
row stays PENDING/PENDING/0, one WARNING per dispatch tried and not taken, without the note.
While the workers refuse, later dispatches are held without being sent (result ``held``)."""

from __future__ import annotations

import logging
import socket
import time

import pytest

from tests.core import support as facts
from tests.core.harness import bearer
from tests.worker.harness import sample_value

NOTE = "비밀스러운 메모: 창가 자리 좋음"


def _unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def _create_and_edit(core) -> tuple[float, int]:
    started = time.monotonic()
    created = await core.create(1, NOTE)
    assert created.status_code == 201, created.text
    edited = await core.client.put(
        f"/api/v1/contexts/{created.json()['contextId']}",
        json={"body": NOTE + " 수정"},
        headers=bearer(1),
    )
    assert edited.status_code == 200, edited.text
    return time.monotonic() - started, edited.json()["contextId"]


async def _assert_pending_untouched(engine, *context_ids):
    for context_id in context_ids:
        state = await facts.state(engine, context_id)
        assert (state.statuses, state.retry_count) == (("PENDING", "PENDING"), 0)


def _commit_dispatches(metrics: str, result: str) -> float:
    return (
        sample_value(metrics, "pinlog_core_dispatches_total", origin="commit", result=result) or 0
    )


def _dispatch_warnings(caplog) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == "core_service.service.dispatch" and r.levelno == logging.WARNING
    ]


async def test_worker_down_gives_normal_answers_fast_and_one_warning_each(
    make_core, engine, caplog
):
    async with make_core(f"http://127.0.0.1:{_unused_port()}") as core:
        elapsed, new_id = await _create_and_edit(core)
        await core.app.state.dispatcher.drain(5)

        metrics = (await core.ops.get("/metrics")).text

    assert elapsed < 1.0
    await _assert_pending_untouched(engine, new_id)
    warnings = _dispatch_warnings(caplog)
    assert 1 <= len(warnings) <= 2
    assert all("ConnectError" in r.getMessage() for r in warnings)
    assert not any(NOTE[:4] in r.getMessage() for r in caplog.records)
    assert _commit_dispatches(metrics, "unreachable") == len(warnings)
    assert _commit_dispatches(metrics, "unreachable") + _commit_dispatches(metrics, "held") == 2


async def test_worker_that_hangs_does_not_delay_the_response(
    make_core, fake_worker, engine, caplog
):
    fake_worker.mode = "hang"
    async with make_core(fake_worker.base_url, dispatch_read_timeout_seconds=0.5) as core:
        elapsed, new_id = await _create_and_edit(core)
        await fake_worker.wait_for_requests(2)
        await core.app.state.dispatcher.drain(5)

    assert elapsed < 1.0
    await _assert_pending_untouched(engine, new_id)
    warnings = _dispatch_warnings(caplog)
    assert len(warnings) == 2
    assert all("ReadTimeout" in r.getMessage() for r in warnings)


@pytest.mark.serial  # a time bound that a loaded machine can miss
async def test_worker_answering_503_leaves_pending_for_the_rescan(
    make_core, fake_worker, engine, caplog
):
    fake_worker.mode = "refuse"
    async with make_core(fake_worker.base_url) as core:
        elapsed, new_id = await _create_and_edit(core)
        await fake_worker.wait_for_requests(1)
        await core.app.state.dispatcher.drain(5)
        metrics = (await core.ops.get("/metrics")).text

    assert elapsed < 1.0
    await _assert_pending_untouched(engine, new_id)
    warnings = _dispatch_warnings(caplog)
    assert [r.getMessage().count("HTTP 503") for r in warnings] == [1] * len(warnings)
    assert _commit_dispatches(metrics, "refused") == len(warnings) >= 1
    assert _commit_dispatches(metrics, "refused") + _commit_dispatches(metrics, "held") == 2


async def test_several_workers_are_used_in_turn_and_a_dead_one_is_skipped(
    make_core, engine, caplog
):
    from tests.fake_worker import FakeWorker
    from tests.worker.harness import SECRET, serving

    first, second = FakeWorker(SECRET), FakeWorker(SECRET)
    async with serving(first.app) as first_url, serving(second.app) as second_url:
        dead = f"http://127.0.0.1:{_unused_port()}"
        async with make_core(f"{first_url}, {dead},{second_url}/") as core:
            for index in range(6):
                created = await core.create(1, f"메모 {index}", place=f"p{index}")
                assert created.status_code == 201
            await core.app.state.dispatcher.drain(5)

    assert len(first.requests) + len(second.requests) == 6
    assert len(first.requests) >= 2 and len(second.requests) >= 2
    assert _dispatch_warnings(caplog) == []  # a skipped replica is not a failed dispatch
