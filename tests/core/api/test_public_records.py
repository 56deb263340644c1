"""No enumeration (§9 Deviation "another member's view by public id"): a record id names only
the caller's own record, another member's answering exactly as a missing one (status, headers,
body, and the statements and round trips the core ran, counted on the wire); another member
reads the public view by the record's ``publicId``, 22 characters of base64url over 128
random bits set by the create statement. Real HTTP, real PostgreSQL."""

from __future__ import annotations

import base64
import contextlib
import re

from sqlalchemy import text

from tests.core import support as facts
from tests.core.harness import bearer, core_settings, running_core
from tests.fault_proxy import fault_proxy

PUBLIC_ID = re.compile(r"[A-Za-z0-9_-]{22}")


@contextlib.asynccontextmanager
async def _core_through(proxy, fake_worker):
    """One pooled connection through the counting proxy, as ``test_round_trips`` runs it."""
    settings = core_settings(
        proxy.url, fake_worker.base_url, database_pool_size=1, status_refresh_seconds=3600
    )
    async with running_core(settings) as core:
        yield core


def _answer(response) -> tuple[int, list[tuple[str, str]], bytes]:
    """Status, headers (the date aside) and body bytes."""
    headers = sorted((k, v) for k, v in response.headers.items() if k.lower() != "date")
    return response.status_code, headers, response.content


async def _read_counted(proxy, core, url: str, member: int):
    trips, statements = proxy.round_trips, len(proxy.statements)
    response = await core.client.get(url, headers=bearer(member))
    return _answer(response), proxy.round_trips - trips, proxy.statements[statements:]


async def test_another_members_record_id_answers_exactly_as_a_missing_one(
    migrated_database, members, fake_worker, engine
):
    async with fault_proxy(migrated_database) as proxy, _core_through(proxy, fake_worker) as core:
        theirs = (await core.create(1, "회사 앞 김밥집", place="p-theirs")).json()["recordId"]
        own = (await core.create(2, "내 메모", place="p-own")).json()["recordId"]
        await fake_worker.wait_for_requests(2)
        await core.app.state.dispatcher.drain(5)  # the dispatches' counting statements are over
        missing = max(theirs, own) + 1000
        urls = {
            "theirs": f"/api/v1/records/{theirs}",
            "missing": f"/api/v1/records/{missing}",
        }
        for url in urls.values():  # statements prepared on the one pooled connection
            await core.client.get(url, headers=bearer(2))
        counted = {name: await _read_counted(proxy, core, url, 2) for name, url in urls.items()}
        mine = await core.client.get(f"/api/v1/records/{own}", headers=bearer(2))

    assert counted["theirs"] == counted["missing"]
    answer, trips, statements = counted["theirs"]
    assert answer[0] == 404
    assert answer[2] == b'{"detail":"record not found"}'
    assert trips == 1
    assert len(statements) == 1
    assert mine.status_code == 200
    # Nothing of the note leaked through the other route either.
    assert "김밥" not in str(counted)


async def test_a_public_id_is_22_characters_of_128_random_bits_named_to_the_owner(
    core_with_fake_worker, engine
):
    core = core_with_fake_worker
    first = await core.create(1, "첫 메모", place="p-1")
    again = await core.create(1, "둘째 메모", place="p-1")
    other = await core.create(1, "다른 곳", place="p-2")
    read = await core.client.get(f"/api/v1/records/{first.json()['recordId']}", headers=bearer(1))
    listed = await core.client.get("/api/v1/records", headers=bearer(1))

    public_id = first.json()["publicId"]
    assert (first.status_code, again.status_code) == (201, 200)
    assert PUBLIC_ID.fullmatch(public_id)
    assert len(base64.urlsafe_b64decode(public_id + "==")) == 16
    assert again.json()["publicId"] == public_id  # the record's, not the note's
    assert other.json()["publicId"] != public_id
    assert read.json()["publicId"] == public_id
    assert {r["publicId"] for r in listed.json()["records"]} == {
        public_id,
        other.json()["publicId"],
    }
    assert await facts.public_id(engine, first.json()["recordId"]) == public_id


async def test_every_inserted_record_gets_a_distinct_public_id_from_the_default(engine, members):
    """The column's default (0090) gives every insert its own value: the create statement,
    the step-by-step create, and rows a core before 0090 inserts during a rollout."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO core.place (external_place_id, name) "
                "SELECT 'bulk-' || g, 'p' FROM generate_series(1, 300) AS g"
            )
        )
        rows = await conn.execute(
            text(
                "INSERT INTO core.record (member_id, place_id) "
                "SELECT 1, id FROM core.place WHERE external_place_id LIKE 'bulk-%' "
                "RETURNING public_id"
            )
        )
        public_ids = [row.public_id for row in rows]

    assert len(public_ids) == 300
    assert len(set(public_ids)) == 300
    assert all(PUBLIC_ID.fullmatch(p) for p in public_ids)
    # Every base64url character position varies: no fixed UUID version or variant bits.
    decoded = [base64.urlsafe_b64decode(p + "==") for p in public_ids]
    for position in range(16):
        assert len({d[position] for d in decoded}) > 100, position


async def test_the_public_view_answers_by_public_id_only(core_with_fake_worker, engine):
    core = core_with_fake_worker
    created = (await core.create(1, "자취방 근처 분식집", place="p-1")).json()
    public_url = f"/api/v1/public-records/{created['publicId']}"

    other = await core.client.get(public_url, headers=bearer(2))
    unknown = await core.client.get(f"/api/v1/public-records/{'A' * 22}", headers=bearer(2))
    malformed = [
        await core.client.get(f"/api/v1/public-records/{bad}", headers=bearer(2))
        for bad in ("A" * 21, "A" * 23, "A" * 21 + "=", str(created["recordId"]))
    ]
    unauthenticated = await core.client.get(public_url)
    await core.client.delete(f"/api/v1/records/{created['recordId']}", headers=bearer(1))
    deleted = await core.client.get(public_url, headers=bearer(2))

    assert other.status_code == 200
    assert other.json()["publicId"] == created["publicId"]
    assert "recordId" not in other.json()
    assert "분식집" not in other.text
    assert unknown.status_code == 404
    for answer in (*malformed, deleted):
        assert _answer(answer) == _answer(unknown)
    assert unauthenticated.status_code == 401
