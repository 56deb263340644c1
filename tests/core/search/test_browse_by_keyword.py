"""Browse by keyword, ``GET /api/v1/records?keyword=CODE`` (docs/core-service.md): the owner's
view (§9), the list's keyset pages, a cursor bound to its keyword; an unknown, inactive or
``BLOCKED`` code is 422."""

from __future__ import annotations

from tests.core import support as facts
from tests.core.harness import bearer
from tests.worker.harness import PROFILE
from tests.worker.support import make_preset


async def _presets(engine) -> None:
    await make_preset(engine, preset_id=1, code="QUIET", profile=PROFILE)
    await make_preset(engine, preset_id=2, code="SOLO", visibility="PRIVATE_ONLY", profile=PROFILE)
    await make_preset(engine, preset_id=3, code="RETIRED", is_active=False, profile=PROFILE)
    await make_preset(engine, preset_id=4, code="RUDE", visibility="BLOCKED", profile=PROFILE)


async def _judged(core, engine, member, place, keyword_ids, *, keyword_status="COMPLETED"):
    response = await core.create(member, f"메모 {place}", place=place)
    record_id, context_id = response.json()["recordId"], response.json()["contextId"]
    await facts.make_judged(
        engine,
        context_id=context_id,
        user_id=member,
        record_id=record_id,
        profile=PROFILE,
        keyword_ids=keyword_ids,
        keyword_status=keyword_status,
    )
    return record_id


async def _list(core, member, **params):
    return await core.client.get("/api/v1/records", params=params, headers=bearer(member))


async def test_browse_pages_through_the_owners_records_with_the_keyword(
    core_with_fake_worker, engine
):
    core = core_with_fake_worker
    await _presets(engine)
    quiet = [await _judged(core, engine, 1, f"q{i}", (1,)) for i in range(5)]
    solo = await _judged(core, engine, 1, "solo", (2,))
    await _judged(core, engine, 1, "unjudged", (1,), keyword_status="PROCESSING")
    await _judged(core, engine, 2, "theirs", (1,))

    pages, cursor = [], None
    while True:
        params = {"keyword": "QUIET", "limit": 2} | ({"cursor": cursor} if cursor else {})
        response = await _list(core, 1, **params)
        assert response.status_code == 200, response.text
        pages.append([r["recordId"] for r in response.json()["records"]])
        cursor = response.json()["nextCursor"]
        if cursor is None:
            break
    private = await _list(core, 1, keyword="SOLO")

    assert pages == [quiet[::-1][0:2], quiet[::-1][2:4], quiet[::-1][4:]]
    assert [r["recordId"] for r in private.json()["records"]] == [solo]


async def test_a_cursor_is_bound_to_its_keyword_and_bad_codes_are_422(
    core_with_fake_worker, engine
):
    core = core_with_fake_worker
    await _presets(engine)
    for i in range(3):
        await _judged(core, engine, 1, f"q{i}", (1, 2))
    quiet_cursor = (await _list(core, 1, keyword="QUIET", limit=1)).json()["nextCursor"]
    plain_cursor = (await _list(core, 1, limit=1)).json()["nextCursor"]

    other_keyword = await _list(core, 1, keyword="SOLO", cursor=quiet_cursor)
    plain_with_keyword = await _list(core, 1, keyword="QUIET", cursor=plain_cursor)
    keyword_without = await _list(core, 1, cursor=quiet_cursor)
    same = await _list(core, 1, keyword="QUIET", cursor=quiet_cursor)
    bad = {code: await _list(core, 1, keyword=code) for code in ("NOPE", "RETIRED", "RUDE")}
    malformed = await _list(core, 1, keyword="not a code")

    assert same.status_code == 200 and len(same.json()["records"]) == 2  # the other two
    for response in (other_keyword, plain_with_keyword, keyword_without):
        assert response.status_code == 422
        assert response.json() == {
            "detail": "invalid request",
            "errors": [
                {
                    "loc": ["query", "cursor"],
                    "msg": "cursor belongs to another listing",
                    "type": "value_error",
                }
            ],
        }
    assert {code: r.status_code for code, r in bad.items()} == dict.fromkeys(bad, 422)
    assert bad["RUDE"].json() == {
        "detail": "invalid request",
        "errors": [
            {
                "loc": ["query", "keyword"],
                "msg": "keyword is unknown, inactive or blocked",
                "type": "value_error",
            }
        ],
    }
    assert malformed.status_code == 422
