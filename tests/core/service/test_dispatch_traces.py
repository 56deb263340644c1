"""A dispatch the workers refused keeps its note's trace while it waits in the retry set
(``core_service/service/dispatch.py``): the retry loop's send continues the client request's
trace. A real core app on uvicorn, ``FakeWorker`` over HTTP, spans exported to a real OTLP/HTTP
receiver (``tests/otlp_receiver.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pinlog_platform import tracing
from tests.otlp_receiver import OtlpReceiver, exporting_to


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


async def test_a_held_dispatch_is_sent_again_in_its_notes_trace(
    make_core, fake_worker, receiver: OtlpReceiver
):
    fake_worker.mode, fake_worker.retry_after = "refuse", "1"
    with exporting_to(receiver):
        async with make_core(fake_worker.base_url) as core:
            response = await core.create(1, "메모", place="p1")
            assert response.status_code in (200, 201), response.text
            await fake_worker.wait_for_requests(1)
            fake_worker.mode = "accept"
            await fake_worker.wait_for_requests(2, timeout_seconds=5)
        tracing.shutdown()

    (created,) = [s for s in receiver.spans if s.name == "POST /api/v1/records"]
    sent = [header.split("-") for header in fake_worker.traceparents if header is not None]
    assert [trace_id for _, trace_id, _, _ in sent] == [created.trace_id, created.trace_id]
    dispatches = {
        s.span_id: s
        for s in receiver.spans
        if s.name == "dispatch" and s.trace_id == created.trace_id
    }
    origins = sorted(s.attributes["pinlog.origin"] for s in dispatches.values())
    assert origins == ["commit", "retry"]
    (retry,) = [s for s in dispatches.values() if s.attributes["pinlog.origin"] == "retry"]
    # The retry hangs under the dispatch that was refused, in the request's trace.
    assert dispatches[retry.parent_span_id].attributes["pinlog.origin"] == "commit"
