"""Routing by embedding profile while workers of two profiles run side by side
(docs/operations.md "Switching the embedding profile"): the order ``WorkerEndpoints.in_turn``
gives, the profiles ``ProfileRouting`` reads from each worker's ``/readyz``, process requests
that name the profile in use and move on after a 409, searches asked only of the profile in
use (read from ``core.embedding_switch``) that skip a 422, and which workers a reclassification
waits for. The workers are real local HTTP servers."""

from __future__ import annotations

import pytest

from core_service.metrics import CoreMetrics
from core_service.operations.keyword_reprocess import workers_on
from core_service.repository.db import autocommit
from core_service.service.personal_search import PersonalSearch
from core_service.service.process_requests import DispatchResult, ProcessRequestSender
from core_service.service.profile_in_use import ProfileInUse
from core_service.service.search_terms import SearchAnalyser
from core_service.service.worker_endpoints import WorkerEndpoints
from core_service.service.worker_readiness import WorkerReadiness
from tests.core.harness import DISPATCH_REQUEST as REQUEST
from tests.core.harness import core_settings, endpoints_of, profile_routing, profile_workers
from tests.core.support import (
    TARGET,
    THIRD,
    created,
    switch_cut_over,
    switch_roll_back,
    switch_start,
)
from tests.fake_worker import FakeWorker
from tests.worker.harness import PROFILE, SECRET, serving

NOWHERE = "http://127.0.0.1:9"  # the discard port: nothing listens


async def cut_over_to_target(engine) -> None:
    async with autocommit(engine) as conn:
        assert await switch_start(conn, target=TARGET, rate=50)
        assert await switch_cut_over(conn)


# --- the order of the instances ---------------------------------------------------------------


async def test_in_turn_gives_the_instances_of_the_profile_then_the_unknown_ones():
    urls = [f"http://127.0.0.1:{port}" for port in (9001, 9002, 9003, 9004)]
    async with endpoints_of(*urls) as endpoints:
        a, unknown, b1, b2 = endpoints.all
        a.profile, b1.profile, b2.profile = PROFILE, TARGET, TARGET

        # Each call starts one further on (round robin), whatever the profile asked.
        turns = [endpoints.in_turn(TARGET) for _ in range(4)]
        no_profile = endpoints.in_turn()
        of_third = endpoints.in_turn(THIRD)
        unknown.profile = PROFILE
        none_match = endpoints.in_turn(THIRD)

    assert turns == [
        [b1, b2, unknown],
        [b1, b2, unknown],
        [b1, b2, unknown],
        [b2, b1, unknown],
    ]
    assert no_profile == [a, unknown, b1, b2]
    # No instance is known to serve it: those not known to serve another, only.
    assert of_third == [unknown]
    # None left: every instance, in case the knowledge is stale.
    assert none_match == [b1, b2, a, unknown]


async def test_routing_reads_each_workers_profile_and_keeps_it_when_unreadable(fake_worker):
    second = FakeWorker(SECRET)
    second.profile = TARGET
    async with serving(second.app) as second_url:
        endpoints = WorkerEndpoints.connect(
            [fake_worker.base_url, second_url, NOWHERE],
            internal_secret=SECRET,
            connect_timeout_seconds=1.0,
            read_timeout_seconds=5.0,
        )
        try:
            async with profile_routing(endpoints) as routing:
                await routing.refresh_once()
                first_read = [e.profile for e in endpoints.all]
                second.ready = False  # a worker not ready still says its profile
                second.profile = THIRD
                await routing.refresh_once()
                second_read = [e.profile for e in endpoints.all]
                of_third = endpoints.in_turn(THIRD)
        except BaseException:
            await endpoints.aclose()
            raise
    try:
        # The second worker is gone: the profile last seen stays.
        async with profile_routing(endpoints) as routing:
            await routing.refresh_once()
            gone = [e.profile for e in endpoints.all]
    finally:
        await endpoints.aclose()

    assert first_read == [PROFILE, TARGET, None]
    assert second_read == [PROFILE, THIRD, None]
    assert [e.base_url for e in of_third] == [second_url, NOWHERE]
    assert gone == [PROFILE, THIRD, None]


async def test_routing_counts_the_ready_workers_by_profile_beside_the_profile_in_use(
    engine, fake_worker
):
    """``pinlog_core_workers_ready{profile}`` and ``pinlog_core_profile_in_use{profile}``, what
    the alert "no ready worker for the profile in use" compares: a worker that is not ready
    and one unreachable count 0 under the profile last seen; after a cutover the profile in use
    is the target, listed at 0 while no worker of it is ready."""
    second = FakeWorker(SECRET)
    second.profile = TARGET
    metrics = CoreMetrics()

    def sample(name: str, profile: str) -> float | None:
        return metrics.registry.get_sample_value(name, {"profile": profile})

    async with serving(second.app) as second_url:
        endpoints = WorkerEndpoints.connect(
            [fake_worker.base_url, second_url, NOWHERE],
            internal_secret=SECRET,
            connect_timeout_seconds=1.0,
            read_timeout_seconds=5.0,
        )
        try:
            async with profile_routing(
                endpoints,
                metrics=metrics,
                profile_in_use=ProfileInUse(engine, configured=PROFILE),
            ) as routing:
                await routing.refresh_once()
                both_ready = [sample("pinlog_core_workers_ready", p) for p in (PROFILE, TARGET)]
                in_use = [sample("pinlog_core_profile_in_use", p) for p in (PROFILE, TARGET)]
                second.ready = False
                await routing.refresh_once()
                target_not_ready = sample("pinlog_core_workers_ready", TARGET)
        except BaseException:
            await endpoints.aclose()
            raise
    try:
        await cut_over_to_target(engine)
        async with profile_routing(
            endpoints, metrics=metrics, profile_in_use=ProfileInUse(engine, configured=PROFILE)
        ) as routing:
            await routing.refresh_once()  # the second worker is gone
            after_cutover = [sample("pinlog_core_workers_ready", p) for p in (PROFILE, TARGET)]
            in_use_after = [sample("pinlog_core_profile_in_use", p) for p in (PROFILE, TARGET)]
    finally:
        await endpoints.aclose()

    assert both_ready == [1, 1]
    assert in_use == [1, None]
    assert target_not_ready == 0
    assert after_cutover == [1, 0]
    assert in_use_after == [None, 1]


# --- process requests ------------------------------------------------------------------------


async def test_process_requests_name_the_profile_in_use_and_move_on_after_a_409(engine):
    await cut_over_to_target(engine)
    async with profile_workers(PROFILE, TARGET) as (old, new):
        async with endpoints_of(old.base_url, new.base_url) as endpoints:
            sender = ProcessRequestSender(
                endpoints,
                attempt_deadline_seconds=5.0,
                profile_in_use=ProfileInUse(engine, configured=PROFILE),
            )
            # Profiles not known yet: the first instance in turn is the old one.
            unknown = await sender.send(REQUEST)
            async with profile_routing(endpoints) as routing:
                await routing.refresh_once()
            routed = [await sender.send(REQUEST) for _ in range(3)]
        async with endpoints_of(old.base_url) as only_old:
            refused = await ProcessRequestSender(
                only_old,
                attempt_deadline_seconds=5.0,
                profile_in_use=ProfileInUse(engine, configured=PROFILE),
            ).send(REQUEST)

    assert (unknown.result, unknown.causes) == (DispatchResult.ACCEPTED, ("HTTP 409", "HTTP 202"))
    assert [(o.result, o.causes) for o in routed] == [
        (DispatchResult.ACCEPTED, ("HTTP 202",))
    ] * 3  # fmt: skip
    # Refused (tried again later), not a verdict on the note.
    assert (refused.result, refused.causes) == (DispatchResult.REFUSED, ("HTTP 409",))
    assert len(old.processed) == 2 and len(new.processed) == 4
    assert {body["embeddingProfile"] for body in old.processed + new.processed} == {TARGET}
    assert new.processed[0] == {**REQUEST.as_json(), "embeddingProfile": TARGET}


# --- personal search -------------------------------------------------------------------------


async def _search(engine, endpoints, profile_in_use: ProfileInUse, cuts):
    search = PersonalSearch(
        engine, endpoints, profile_in_use=profile_in_use, cuts=cuts, analyser=SearchAnalyser()
    )
    return await search.search(member_id=1, query="조용한 카페", limit=5)


async def test_search_asks_only_the_workers_of_the_profile_in_use(
    engine, migrated_database, core_with_fake_worker
):
    record_id, context_id = await created(core_with_fake_worker, "창가 자리가 조용함")
    answer = [{"recordId": record_id, "contextId": context_id, "similarity": 0.8}]
    async with profile_workers(PROFILE, TARGET) as (old, new):
        old.search_results = new.search_results = answer
        cuts = core_settings(migrated_database, old.base_url).search_cuts_for
        async with endpoints_of(old.base_url, new.base_url) as endpoints:
            async with profile_routing(endpoints) as routing:
                await routing.refresh_once()
            cached = ProfileInUse(engine, configured=PROFILE)
            before = [await _search(engine, endpoints, cached, cuts) for _ in range(2)]
            asked_before = (len(old.searched), len(new.searched))
            await cut_over_to_target(engine)
            # Within its cache window a process still asks the previous profile's workers.
            within_cache = await _search(engine, endpoints, cached, cuts)
            asked_within_cache = (len(old.searched), len(new.searched))
            fresh = ProfileInUse(engine, configured=PROFILE)
            after = [await _search(engine, endpoints, fresh, cuts) for _ in range(2)]

    hit = [(record_id, context_id, 0.8)]
    for hits in [*before, within_cache, *after]:
        assert [(h.record_id, h.context_id, h.similarity) for h in hits] == hit
    assert asked_before == (2, 0)
    assert asked_within_cache == (3, 0)
    assert (len(old.searched), len(new.searched)) == (3, 2)
    assert {body["embeddingProfile"] for body in old.searched} == {PROFILE}
    assert new.searched[0] == {
        "userId": 1, "query": "조용한 카페", "limit": 5, "embeddingProfile": TARGET,
        "contextIds": [context_id],  # the core's lexical list found it (조용)
    }  # fmt: skip


async def test_search_skips_a_worker_of_another_profile(
    engine, migrated_database, core_with_fake_worker
):
    record_id, context_id = await created(core_with_fake_worker, "창가 자리가 조용함")
    await cut_over_to_target(engine)
    async with profile_workers(PROFILE, TARGET) as (old, new):
        new.search_results = [{"recordId": record_id, "contextId": context_id, "similarity": 0.7}]
        cuts = core_settings(migrated_database, old.base_url).search_cuts_for
        # The profiles are not known yet: the old worker is asked first and answers 422.
        async with endpoints_of(old.base_url, new.base_url) as endpoints:
            hits = await _search(engine, endpoints, ProfileInUse(engine, configured=PROFILE), cuts)

    assert [(h.record_id, h.context_id) for h in hits] == [(record_id, context_id)]
    assert [body["embeddingProfile"] for body in old.searched] == [TARGET]
    assert [body["embeddingProfile"] for body in new.searched] == [TARGET]


async def test_the_profile_in_use_is_the_switch_rows_once_read(engine):
    cached = ProfileInUse(engine, configured=PROFILE)
    assert await cached.current() == PROFILE  # no row: the configured profile
    await cut_over_to_target(engine)

    assert await cached.current() == PROFILE  # read at most CACHE_SECONDS ago
    assert await ProfileInUse(engine, configured=PROFILE).current() == TARGET
    async with autocommit(engine) as conn:
        await switch_roll_back(conn)
    assert await ProfileInUse(engine, configured=PROFILE).current() == PROFILE


# --- which workers a reclassification waits for ---------------------------------------------


def _reading(profile: str | None, *, ready: bool = True, version: int | None = 2):
    if profile is None:
        return WorkerReadiness("http://w", problem="unreachable (ClientConnectorError)")
    return WorkerReadiness("http://w", ready=ready, profile=profile, preset_version=version)


@pytest.mark.parametrize(
    ("readings", "expected"),
    [
        ([_reading(TARGET), _reading(PROFILE, version=1)], True),
        ([_reading(TARGET), _reading(PROFILE, ready=False)], True),
        ([_reading(TARGET), _reading(TARGET, version=1)], False),
        ([_reading(TARGET), _reading(TARGET, ready=False)], False),
        ([_reading(TARGET), _reading(None)], False),  # it may serve TARGET: it must answer
        ([_reading(PROFILE)], False),  # no worker of TARGET at all
        ([], False),
    ],
)
def test_only_workers_of_the_profile_must_report_the_list(readings, expected):
    assert workers_on(readings, profile=TARGET, version=2) is expected
