"""The re-embedding backfill's batches against a real worker over HTTP (issue 28 #9;
``core_service/service/reembed_backfill.py`` "Batches"): a batch is cut by the worker's body
limit (``maxRequestBytes`` of its ``/readyz``) as well as by count; a 413 (a limit lower than
the core knows) splits it; a note that cannot fit in a request alone ends ``FAILED``
``input_too_long``; the rest completes and nothing is proposed again in the same order.

The switch here backfills the real worker's profile (``PROFILE``, the fake OpenAI provider)
beside ``TARGET`` as the profile in use, so the real worker is the backfill's target.
"""

from __future__ import annotations

import itertools

import orjson
import pytest
from sqlalchemy import text

from core_service.metrics import CoreMetrics
from core_service.repository import embedding_switch
from core_service.repository.db import autocommit
from core_service.repository.embedding_switch import BackfillSource
from core_service.service.pause import PauseSwitch
from core_service.service.reembed_backfill import (
    BODY_MARGIN_BYTES,
    MAX_BATCH,
    ReembedBackfill,
    backfill_payload,
    cut_by_bytes,
)
from tests.core.harness import endpoints_of, profile_routing
from tests.core.support import TARGET, backfill_rows, created, make_judged, switch_start
from tests.worker.backfill_support import vectors_by_profile
from tests.worker.harness import PROFILE

# Korean syllables: three bytes each in the UTF-8 body.
SYLLABLES = "창가자리조용노트북작업좋음비오는날아늑한카페주차편하고아이랑식당바다산책로"
# The stored note's length limit (characters after normalisation).
NOTE_CHARS = 500


def long_korean_note(n: int) -> str:
    """A 500-character Korean note, distinct per ``n`` (1500 bytes and more in JSON)."""
    head = f"{n}번 메모 "
    return head + (SYLLABLES * 20)[: NOTE_CHARS - len(head)]


async def notes_under_the_profile_in_use(core, engine, bodies: list[str]) -> list[int]:
    """Notes created through the core, judged under ``TARGET``; a switch backfilling the real
    worker's ``PROFILE`` beside it, its rows seeded; their context ids, ascending."""
    ids = []
    for n, body in enumerate(bodies):
        record_id, context_id = await created(core, body, place=f"p{n}")
        await make_judged(
            engine, context_id=context_id, user_id=1, record_id=record_id, profile=TARGET
        )
        ids.append(context_id)
    async with autocommit(engine) as conn:
        assert await switch_start(conn, in_use=TARGET, target=PROFILE, rate=MAX_BATCH)
        assert await embedding_switch.seed(
            conn, profile=PROFILE, completed_only=False, generation=None
        ) == len(ids)
    return sorted(ids)


async def one_pass(engine, worker, *, read_limit: bool) -> ReembedBackfill:
    """One backfill pass of one core process to ``worker``, its batches waited for;
    ``read_limit``: the worker's ``/readyz`` was read first (else its limit is unknown)."""
    metrics = CoreMetrics()
    async with endpoints_of(str(worker.client.base_url)) as endpoints:
        if read_limit:
            async with profile_routing(endpoints) as routing:
                await routing.refresh_once()
            assert endpoints.all[0].max_request_bytes == worker.settings.max_request_bytes
        loop = ReembedBackfill(
            engine,
            endpoints,
            PauseSwitch(engine),
            metrics,
            configured_profile=TARGET,
            resend_seconds=600,
            expiry_seconds=600,
        )
        assert await loop.pass_once() == 0.0
        await loop.drain()
    return loop


# Unknown, the limit is taken as 64 KiB: requests of 42 and 22 notes (about 1.5 KB each);
# at 16 KiB each 413 halves a request (the first half first) until 10 or fewer remain.
SPLITS_AT_16_KIB = [42, 21, 11, 21, 11, 22, 11, 11]


def answered_413(caplog) -> list[str]:
    """The core's lines for backfill requests the worker answered 413."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "core_service.service.reembed_backfill" and "(413)" in r.getMessage()
    ]


@pytest.mark.parametrize(
    ("worker_limit", "read_limit", "refused_413"),
    [(65536, True, []), (16384, True, []), (16384, False, SPLITS_AT_16_KIB)],
    ids=["64KiB-read", "16KiB-read", "16KiB-unknown-413-splits"],
)
async def test_64_long_korean_notes_are_cut_to_the_workers_body_limit(
    engine, core_with_fake_worker, make_worker, fake_openai, caplog,
    worker_limit, read_limit, refused_413,
):  # fmt: skip
    """Issue 28 #9: 64 long Korean notes (about 100 KB) to a worker taking 64 KiB or 16 KiB.
    Unknown, the core assumes the default 64 KiB: the 16 KiB worker's 413s split the requests
    (``SPLITS_AT_16_KIB``) until each fits."""
    bodies = [long_korean_note(n) for n in range(64)]
    ids = await notes_under_the_profile_in_use(core_with_fake_worker, engine, bodies)
    async with make_worker(max_request_bytes=worker_limit) as worker:
        loop = await one_pass(engine, worker, read_limit=read_limit)

    assert await backfill_rows(engine, PROFILE) == {i: ("COMPLETED", True) for i in ids}
    assert loop.results["completed"] == 64
    assert loop.results["refused"] == 0
    assert sum(len(r["input"]) for r in fake_openai.embedding_requests) == 64
    assert len(fake_openai.embedding_requests) > 1  # more than one request was needed
    assert answered_413(caplog) == [
        f"backfill request of {n} context(s) over the worker's body limit (413)"
        for n in refused_413
    ]
    assert set(await vectors_by_profile(engine, ids[0])) == {TARGET, PROFILE}
    async with autocommit(engine) as conn:  # nothing left to propose again
        assert (
            await embedding_switch.propose(
                conn,
                profile=PROFILE,
                limit=MAX_BATCH,
                resend_seconds=0,
                expiry_seconds=600,
                generation=None,
            )
            == []
        )


@pytest.mark.parametrize("read_limit", [True, False], ids=["limit-read", "limit-unknown-413"])
async def test_a_note_that_cannot_fit_alone_fails_with_its_reason_and_the_rest_proceeds(
    engine, core_with_fake_worker, make_worker, fake_openai, read_limit
):
    bodies = ["짧은 메모 하나", long_korean_note(1), "짧은 메모 둘", "짧은 메모 셋"]
    ids = await notes_under_the_profile_in_use(core_with_fake_worker, engine, bodies)
    too_long = ids[1]

    async with make_worker(max_request_bytes=1024) as worker:
        loop = await one_pass(engine, worker, read_limit=read_limit)

    rows = await backfill_rows(engine, PROFILE)
    assert rows.pop(too_long) == ("FAILED", False)
    assert rows == {i: ("COMPLETED", True) for i in ids if i != too_long}
    async with engine.connect() as conn:
        reason = await conn.scalar(
            text(
                "SELECT failure_reason FROM ai.context_embedding_backfill "
                "WHERE embedding_profile = :p AND context_id = :id"
            ),
            {"p": PROFILE, "id": too_long},
        )
    assert reason == "input_too_long"
    assert (loop.results["completed"], loop.results["failed"]) == (3, 1)
    # The long note never reached the provider.
    assert all(long_korean_note(1) not in r["input"] for r in fake_openai.embedding_requests)
    assert set(await vectors_by_profile(engine, too_long)) == {TARGET}


def test_a_cut_keeps_the_order_and_each_request_under_the_limit():
    sources = [BackfillSource(i, 1, i, long_korean_note(i)) for i in range(1, 65)]
    whole = len(orjson.dumps(backfill_payload(PROFILE, sources)))

    requests, unsendable = cut_by_bytes(PROFILE, sources, 65536)

    assert whole > 65536  # the count alone would make one request the worker refuses
    assert unsendable == []
    assert [s for request in requests for s in request] == sources
    sizes = [len(orjson.dumps(backfill_payload(PROFILE, r))) for r in requests]
    assert max(sizes) <= 65536 - BODY_MARGIN_BYTES
    # Greedy: each request but the last could not take the next note too.
    for request, following in itertools.pairwise(requests):
        grown = len(orjson.dumps(backfill_payload(PROFILE, [*request, following[0]])))
        assert grown > 65536 - BODY_MARGIN_BYTES
