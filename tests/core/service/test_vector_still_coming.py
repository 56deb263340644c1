"""A note waiting for its vector of the profile in use spends none of its retry budget (issue
28; docs/rescan.md "Budget"): after a cutover, a note embedded under the previous profile
just before it has no vector of the new one until the backfill makes it. The real worker
(over HTTP, the fake OpenAI provider) answers the rescan's re-requests 202 and claims nothing
("vector of this profile still coming"); those re-requests are free, so a slow backfill never
ends the keyword stage FAILED ``retries_exhausted``. Once the vector is there, the next
re-request judges the note."""

from __future__ import annotations

from core_service.composition import build_dispatcher, build_scheduler, build_worker_endpoints
from core_service.metrics import CoreMetrics
from core_service.repository import embedding_switch
from core_service.repository.db import autocommit, create_engine
from tests.core import support as facts
from tests.core.harness import core_settings
from tests.core.support import (
    TARGET,
    add_vector,
    backfill_rows,
    created,
    make_judged,
    switch_cut_over,
    switch_start,
)
from tests.worker.backfill_support import set_backfill
from tests.worker.harness import PROFILE

PENDING_STALE = 301  # seconds: past the 300 s PENDING expiry
MAX_RETRY = 3


async def test_re_requests_while_the_vector_is_coming_spend_no_retry(
    engine, migrated_database, core_with_fake_worker, fake_worker, worker
):
    record_id, context_id = await created(core_with_fake_worker, "비 오는 날 가기 좋은 카페")
    await core_with_fake_worker.app.state.dispatcher.drain(5)  # the create's, free
    # Embedded under TARGET just before the cutover to the real worker's PROFILE; the keyword
    # stage still to run under the new profile.
    await make_judged(
        engine,
        context_id=context_id,
        user_id=1,
        record_id=record_id,
        profile=TARGET,
        keyword_status="PENDING",
        preset_version=None,
    )
    async with autocommit(engine) as conn:
        assert await switch_start(conn, in_use=TARGET, target=PROFILE, rate=50)
        assert await switch_cut_over(conn, force=True)
        assert (
            await embedding_switch.seed(conn, profile=PROFILE, completed_only=True, generation=None)
            == 1
        )
    settings = core_settings(migrated_database, str(worker.client.base_url))
    core_engine = create_engine(settings.database_url, pool_size=2)
    endpoints = build_worker_endpoints(settings)
    try:
        metrics = CoreMetrics()
        dispatcher = build_dispatcher(settings, core_engine, endpoints, metrics)
        scheduler = build_scheduler(settings, core_engine, dispatcher, metrics)

        # More re-requests than the budget holds, each taken by the worker (202).
        counts = []
        for _ in range(MAX_RETRY + 2):
            await facts.backdate(engine, context_id, PENDING_STALE)
            report = await scheduler.run_once()
            assert report.dispatched == 1
            await worker.drain()
            counts.append((await facts.state(engine, context_id)).retry_count)
        waiting = await facts.state(engine, context_id)

        # The backfill delivers the vector; the next re-request judges the note.
        await add_vector(engine, context_id, PROFILE)
        await set_backfill(engine, PROFILE, context_id, status="COMPLETED")
        await facts.backdate(engine, context_id, PENDING_STALE)
        await scheduler.run_once()
        await worker.drain()
        done = await facts.state(engine, context_id)
    finally:
        await endpoints.aclose()
        await core_engine.dispose()

    assert counts == [0] * (MAX_RETRY + 2)
    assert waiting.statuses == ("COMPLETED", "PENDING")
    assert await backfill_rows(engine, PROFILE) == {context_id: ("COMPLETED", False)}
    assert done.statuses == ("COMPLETED", "COMPLETED")
    assert done.retry_count == 1  # a re-request that did run is counted as before
