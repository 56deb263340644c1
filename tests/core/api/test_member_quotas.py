"""Quotas per member, over real HTTP and SQL: token buckets in
``core.rate_bucket`` shared by replicas, 429 with ``Retry-After``, other members unaffected,
counted in metrics, failing open when the bucket cannot be written; a daily note cap."""

from __future__ import annotations

from sqlalchemy import text

from tests.core.harness import bearer
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


async def test_the_daily_note_cap(make_core, fake_worker):
    async with make_core(fake_worker.base_url, member_daily_notes=2) as core:
        first = await core.create(1, "하나")
        record_id = first.json()["recordId"]
        added = await core.client.post(
            f"/api/v1/records/{record_id}/contexts", json={"body": "둘"}, headers=bearer(1)
        )
        third = await core.create(1, "셋", place="other")
        other = await core.create(2, "다른 회원")
    assert (first.status_code, added.status_code) == (201, 201)
    assert third.status_code == 429 and int(third.headers["Retry-After"]) > 0
    assert other.status_code == 201
