"""Quotas per member, over real HTTP and SQL: token buckets in
``core.rate_bucket`` shared by replicas, 429 with ``Retry-After``, other members unaffected,
counted in metrics, failing open when the bucket cannot be written; a daily note cap."""

from __future__ import annotations

import asyncio

from sqlalchemy import text

from tests.core.harness import bearer, make_member
from tests.worker.harness import sample_value

QUOTA = "pinlog_core_member_quota_total"


async def _search(core, member_id: int):
    return await core.client.post(
        "/api/v1/search", json={"query": "카페", "limit": 5}, headers=bearer(member_id)
    )


async def test_a_member_over_the_write_quota_gets_429_and_another_member_does_not(
    make_core, fake_worker
):
    limits = {"member_writes_per_minute": 6, "member_burst": 3}
    async with make_core(fake_worker.base_url, **limits) as core:
        answers = [(await core.create(1, f"메모 {i}", place=f"p{i}")).status_code for i in range(3)]
        over = await core.create(1, "하나 더", place="p9")
        other = await core.create(2, "다른 회원")
        metrics = (await core.ops.get("/metrics")).text

    assert answers == [201, 201, 201]
    assert over.status_code == 429
    assert 1 <= int(over.headers["Retry-After"]) <= 10
    assert over.headers["Cache-Control"] == "no-store"
    assert other.status_code == 201
    assert sample_value(metrics, QUOTA, kind="write", outcome="limited") == 1
    assert sample_value(metrics, QUOTA, kind="write", outcome="admitted") == 4


async def test_two_replicas_share_one_bucket_and_searches_have_their_own(make_core, fake_worker):
    fake_worker.search_answer = {"results": []}
    limits = {"member_searches_per_minute": 60, "member_burst": 2, "member_writes_per_minute": 60}
    async with (
        make_core(fake_worker.base_url, **limits) as first,
        make_core(fake_worker.base_url, **limits) as second,
    ):
        assert (await _search(first, 1)).status_code != 429
        assert (await _search(second, 1)).status_code != 429
        limited = await _search(first, 1)
        assert limited.status_code == 429 and limited.headers["Retry-After"] == "1"
        # Writes are a bucket of their own; reads take no token.
        assert (await first.create(1, "메모")).status_code == 201
        assert (await second.client.get("/api/v1/records/1", headers=bearer(1))).status_code != 429


async def test_the_limiter_fails_open_when_the_bucket_cannot_be_written(
    make_core, fake_worker, engine
):
    async with make_core(fake_worker.base_url, member_writes_per_minute=60, member_burst=1) as core:
        async with engine.begin() as conn:
            await conn.execute(text("ALTER TABLE core.rate_bucket RENAME TO rate_bucket_away"))
        try:
            answers = [
                (await core.create(1, f"메모 {i}", place=f"q{i}")).status_code for i in range(3)
            ]
        finally:
            async with engine.begin() as conn:
                await conn.execute(text("ALTER TABLE core.rate_bucket_away RENAME TO rate_bucket"))
        metrics = (await core.ops.get("/metrics")).text
    assert answers == [201, 201, 201]
    assert sample_value(metrics, QUOTA, kind="write", outcome="failed_open") == 3


async def _no_daily_counts(engine) -> None:
    # core.member_daily_notes is not among the tables the session empties before each test.
    async with engine.begin() as conn:
        await conn.execute(text("DELETE FROM core.member_daily_notes"))


async def test_the_daily_note_cap_counts_creates_adds_and_edits(make_core, fake_worker, engine):
    await _no_daily_counts(engine)
    async with make_core(fake_worker.base_url, member_daily_notes=3) as core:
        first = await core.create(1, "하나")
        record_id, context_id = first.json()["recordId"], first.json()["contextId"]
        added = await core.client.post(
            f"/api/v1/records/{record_id}/contexts", json={"body": "둘"}, headers=bearer(1)
        )
        edited = await core.client.put(
            f"/api/v1/contexts/{context_id}", json={"body": "하나 고침"}, headers=bearer(1)
        )
        assert added.status_code == 201, added.text
        refused_create = await core.create(1, "넷", place="other")
        refused_edit = await core.client.put(
            f"/api/v1/contexts/{added.json()['contextId']}",
            json={"body": "둘 고침"},
            headers=bearer(1),
        )
        other = await core.create(2, "다른 회원")
        metrics = (await core.ops.get("/metrics")).text
    assert (first.status_code, added.status_code, edited.status_code) == (201, 201, 200)
    assert refused_create.status_code == 429 and int(refused_create.headers["Retry-After"]) > 0
    assert refused_edit.status_code == 429
    assert other.status_code == 201
    async with engine.connect() as conn:
        places = (
            await conn.execute(
                text(
                    "SELECT count(*) FROM core.record r JOIN core.place p ON p.id = r.place_id "
                    "WHERE r.member_id = 1 AND p.external_place_id = 'other'"
                )
            )
        ).scalar_one()
    # The refused create wrote no record either (rolled back with the refusal).
    assert places == 0
    assert sample_value(metrics, QUOTA, kind="daily_notes", outcome="limited") == 2


async def test_forty_parallel_creates_under_a_cap_of_five_make_five_notes(
    make_core, fake_worker, engine
):
    await _no_daily_counts(engine)
    await make_member(engine, 7)
    async with make_core(fake_worker.base_url, member_daily_notes=5) as core:
        # Half at one place (one record, found or raced), half at places of their own.
        answers = await asyncio.gather(
            *(
                core.create(7, f"메모 {i}", place="shared" if i % 2 else f"own-{i}")
                for i in range(40)
            )
        )
        metrics = (await core.ops.get("/metrics")).text
    statuses = sorted(answer.status_code for answer in answers)
    async with engine.connect() as conn:
        notes = (
            await conn.execute(text("SELECT count(*) FROM core.context WHERE member_id = 7"))
        ).scalar_one()
        empty_records = (
            await conn.execute(
                text(
                    "SELECT count(*) FROM core.record r WHERE r.member_id = 7 AND NOT EXISTS "
                    "(SELECT 1 FROM core.context c WHERE c.record_id = r.id)"
                )
            )
        ).scalar_one()
    assert notes == 5
    assert empty_records == 0
    assert statuses.count(429) == 35 and all(status in (200, 201) for status in statuses[:5])
    assert sample_value(metrics, QUOTA, kind="daily_notes", outcome="admitted") == 5
    assert sample_value(metrics, QUOTA, kind="daily_notes", outcome="limited") == 35
