"""Names a member did not write are not shown as theirs: a record shows and
dispatches the place name its owner gave; control and bidirectional formatting characters are
refused in new names and external place ids (422 naming the field); stored names keep reading."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from tests.core.harness import bearer

PHISHING = "\u202eevil\u202c Call +1-555-0100 to claim your prize"


async def _place_name(core, member_id: int, record_id: int) -> str:
    response = await core.client.get(f"/api/v1/records/{record_id}", headers=bearer(member_id))
    assert response.status_code == 200, response.text
    return response.json()["place"]["name"]


async def test_a_record_shows_its_owners_place_name_not_the_first_registered(
    core_with_fake_worker, fake_worker
):
    core = core_with_fake_worker
    # Member 3 registers the place first, with a plausible but wrong name.
    squatter = await core.create(3, "먼저", place="place-9", name="Free drinks, call now")
    owner = await core.create(1, "조용한 카페", place="place-9", name="북카페 온다")
    await fake_worker.wait_for_requests(2)

    assert (squatter.status_code, owner.status_code) == (201, 201)
    assert await _place_name(core, 1, owner.json()["recordId"]) == "북카페 온다"
    assert await _place_name(core, 3, squatter.json()["recordId"]) == "Free drinks, call now"
    assert fake_worker.requests[1]["placeMeta"]["name"] == "북카페 온다"
    listed = await core.client.get("/api/v1/records", headers=bearer(1))
    assert [r["place"]["name"] for r in listed.json()["records"]] == ["북카페 온다"]

    # A further note on the owner's record keeps the owner's first name.
    again = await core.create(1, "두 번째", place="place-9", name="other")
    assert again.status_code == 200
    assert await _place_name(core, 1, owner.json()["recordId"]) == "북카페 온다"


@pytest.mark.parametrize(
    "character",
    ["\u202e", "\u202d", "\u2066", "\u2069", "\u200f", "\x1b", "\x07", "\r", "\n", "\x85", "\x7f"],
)
@pytest.mark.parametrize("field", ["placeName", "externalPlaceId"])
async def test_control_and_bidi_characters_are_refused_naming_the_field(
    core_with_fake_worker, character, field
):
    values = {"externalPlaceId": "place-1", "placeName": "카페", "body": "메모"}
    values[field] = f"가{character}나"
    response = await core_with_fake_worker.client.post(
        "/api/v1/records", json=values, headers=bearer(1)
    )
    assert response.status_code == 422
    assert response.json()["detail"] == "invalid request"
    assert response.json()["errors"][0]["loc"] == ["body", field]


async def test_stored_names_with_such_characters_keep_reading(core_with_fake_worker, engine):
    core = core_with_fake_worker
    created = await core.create(1, "메모", place="place-5", name="이름")
    record_id = created.json()["recordId"]
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE core.record SET place_name = :n WHERE id = :id"),
            {"n": PHISHING, "id": record_id},
        )
    assert await _place_name(core, 1, record_id) == PHISHING


async def test_a_record_from_before_the_migration_shows_the_place_name(
    core_with_fake_worker, engine
):
    core = core_with_fake_worker
    record_id = (await core.create(1, "메모", place="place-6", name="옛 이름")).json()["recordId"]
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE core.record SET place_name = NULL WHERE id = :id"), {"id": record_id}
        )
    assert await _place_name(core, 1, record_id) == "옛 이름"
