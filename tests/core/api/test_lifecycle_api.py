"""The client API's lifecycle operations (§9) over real HTTP, with a fake worker recording
dispatches: what is written, what is cancelled, what is dispatched, and the status codes."""

from __future__ import annotations

import unicodedata

from tests.core import support as facts
from tests.core.harness import bearer
from tests.worker.harness import PROFILE
from tests.worker.support import make_embedding, make_keyword, make_preset, set_statuses

NOTE = "창가 자리 조용하고 콘센트 많음"


async def _created(core, member_id=1, body=NOTE, place="place-1"):
    response = await core.create(member_id, body, place=place)
    assert response.status_code in (200, 201), response.text
    return response.json()


async def _wait_dispatched(fake_worker, count):
    await fake_worker.wait_for_requests(count)


async def test_create_commits_record_context_and_pending_state_then_dispatches(
    core_with_fake_worker, fake_worker, engine
):
    response = await core_with_fake_worker.create(1, f"  {unicodedata.normalize('NFD', NOTE)}\n")

    assert response.status_code == 201
    ids = response.json()
    state = await facts.state(engine, ids["contextId"])
    assert state.statuses == ("PENDING", "PENDING") and state.retry_count == 0
    assert (state.user_id, state.record_id) == (1, ids["recordId"])
    assert (await facts.context(engine, ids["contextId"])).body == NOTE
    await _wait_dispatched(fake_worker, 1)
    assert fake_worker.requests == [
        {
            "contextId": ids["contextId"],
            "userId": 1,
            "recordId": ids["recordId"],
            "text": NOTE,
            "placeMeta": {"externalPlaceId": "place-1", "name": "카페"},
            # The profile in use: a worker of another profile answers 409 (§5 Deviation).
            "embeddingProfile": PROFILE,
        }
    ]


async def test_second_create_for_the_same_place_joins_the_active_record_with_200(
    core_with_fake_worker,
):
    first = await _created(core_with_fake_worker)
    second = await core_with_fake_worker.create(1, "두 번째 메모")
    other_member = await core_with_fake_worker.create(2, "다른 사람의 메모")

    assert second.status_code == 200
    assert second.json()["recordId"] == first["recordId"]
    assert second.json()["contextId"] != first["contextId"]
    assert other_member.status_code == 201
    assert other_member.json()["recordId"] != first["recordId"]


async def test_add_context_to_own_record_is_201_and_pending(core_with_fake_worker, engine):
    created = await _created(core_with_fake_worker)
    response = await core_with_fake_worker.client.post(
        f"/api/v1/records/{created['recordId']}/contexts",
        json={"body": "추가 메모"},
        headers=bearer(1),
    )
    assert response.status_code == 201
    state = await facts.state(engine, response.json()["contextId"])
    assert state.statuses == ("PENDING", "PENDING")


async def test_modify_replaces_the_context_and_inherits_nothing(
    core_with_fake_worker, fake_worker, engine
):
    """Scenario 1: old soft-deleted, both CANCELLED, embedding is_deleted; new id PENDING/0."""
    created = await _created(core_with_fake_worker)
    old_id = created["contextId"]
    await make_preset(engine, preset_id=1)
    await make_embedding(engine, context_id=old_id, user_id=1, record_id=created["recordId"])
    await make_keyword(engine, context_id=old_id, keyword_id=1)

    response = await core_with_fake_worker.client.put(
        f"/api/v1/contexts/{old_id}", json={"body": "완전히 새로운 내용"}, headers=bearer(1)
    )

    assert response.status_code == 200
    new_id = response.json()["contextId"]
    assert new_id != old_id
    old, new = await facts.context(engine, old_id), await facts.context(engine, new_id)
    assert old.deleted and not new.deleted
    assert new.origin_created_at == old.origin_created_at
    assert new.record_id == old.record_id
    assert (await facts.state(engine, old_id)).statuses == ("CANCELLED", "CANCELLED")
    assert await facts.embedding_deleted(engine, old_id) is True
    new_state = await facts.state(engine, new_id)
    assert new_state.statuses == ("PENDING", "PENDING") and new_state.retry_count == 0
    assert await facts.embedding_deleted(engine, new_id) is None
    assert (
        await facts.count(
            engine, "SELECT count(*) FROM ai.context_keyword WHERE context_id = :id", id=new_id
        )
        == 0
    )
    await _wait_dispatched(fake_worker, 2)
    assert fake_worker.context_ids() == [old_id, new_id]


async def test_whitespace_only_edit_is_a_no_op_with_the_old_id(
    core_with_fake_worker, fake_worker, engine
):
    created = await _created(core_with_fake_worker)
    await _wait_dispatched(fake_worker, 1)
    before = await facts.state(engine, created["contextId"])
    record_updated = await facts.count(
        engine,
        "SELECT extract(epoch FROM updated_at) * 1e6 FROM core.record WHERE id = :id",
        id=created["recordId"],
    )

    response = await core_with_fake_worker.client.put(
        f"/api/v1/contexts/{created['contextId']}",
        json={"body": f"\u3000 {unicodedata.normalize('NFD', NOTE)} \n"},
        headers=bearer(1),
    )

    assert response.status_code == 200
    assert response.json() == {"contextId": created["contextId"]}
    assert await facts.state(engine, created["contextId"]) == before
    assert not (await facts.context(engine, created["contextId"])).deleted
    assert record_updated == await facts.count(
        engine,
        "SELECT extract(epoch FROM updated_at) * 1e6 FROM core.record WHERE id = :id",
        id=created["recordId"],
    )
    assert await facts.count(engine, "SELECT count(*) FROM core.context") == 1
    assert len(fake_worker.requests) == 1


async def test_modify_or_delete_of_an_own_deleted_context_is_409(core_with_fake_worker):
    created = await _created(core_with_fake_worker)
    replaced = await core_with_fake_worker.client.put(
        f"/api/v1/contexts/{created['contextId']}", json={"body": "새 내용"}, headers=bearer(1)
    )
    assert replaced.status_code == 200

    again = await core_with_fake_worker.client.put(
        f"/api/v1/contexts/{created['contextId']}", json={"body": "또 다른 내용"}, headers=bearer(1)
    )
    delete = await core_with_fake_worker.client.delete(
        f"/api/v1/contexts/{created['contextId']}", headers=bearer(1)
    )

    assert again.status_code == 409
    assert delete.status_code == 409


async def test_delete_of_the_last_active_context_is_409_and_changes_nothing(
    core_with_fake_worker, engine
):
    created = await _created(core_with_fake_worker)

    response = await core_with_fake_worker.client.delete(
        f"/api/v1/contexts/{created['contextId']}", headers=bearer(1)
    )

    assert response.status_code == 409
    assert "last active" in response.json()["detail"]
    assert not (await facts.context(engine, created["contextId"])).deleted
    assert (await facts.state(engine, created["contextId"])).statuses == ("PENDING", "PENDING")


async def test_delete_context_cancels_both_stages_and_hides_the_vector(
    core_with_fake_worker, engine
):
    first = await _created(core_with_fake_worker)
    second = await _created(core_with_fake_worker, body="두 번째")
    await make_embedding(engine, context_id=first["contextId"], record_id=first["recordId"])
    await set_statuses(
        engine, context_id=first["contextId"], embedding_status="COMPLETED", keyword_status="FAILED"
    )

    response = await core_with_fake_worker.client.delete(
        f"/api/v1/contexts/{first['contextId']}", headers=bearer(1)
    )

    assert response.status_code == 204
    assert (await facts.context(engine, first["contextId"])).deleted
    assert (await facts.state(engine, first["contextId"])).statuses == ("CANCELLED", "CANCELLED")
    assert await facts.embedding_deleted(engine, first["contextId"]) is True
    assert not (await facts.context(engine, second["contextId"])).deleted


async def test_delete_record_cancels_every_context_and_a_new_create_gets_a_new_record(
    core_with_fake_worker, engine
):
    first = await _created(core_with_fake_worker)
    second = await _created(core_with_fake_worker, body="두 번째")
    await make_embedding(engine, context_id=second["contextId"], record_id=first["recordId"])

    response = await core_with_fake_worker.client.delete(
        f"/api/v1/records/{first['recordId']}", headers=bearer(1)
    )
    read = await core_with_fake_worker.client.get(
        f"/api/v1/records/{first['recordId']}", headers=bearer(1)
    )
    recreated = await core_with_fake_worker.create(1, "다시 저장")

    assert response.status_code == 204
    assert read.status_code == 404
    for context_id in (first["contextId"], second["contextId"]):
        assert (await facts.state(engine, context_id)).statuses == ("CANCELLED", "CANCELLED")
        assert (await facts.context(engine, context_id)).deleted
    assert await facts.embedding_deleted(engine, second["contextId"]) is True
    assert recreated.status_code == 201
    assert recreated.json()["recordId"] != first["recordId"]
    assert not any((await facts.invariant_violations(engine)).values())


async def test_withdrawal_cancels_everything_and_revokes_the_token(core_with_fake_worker, engine):
    first = await _created(core_with_fake_worker, place="a")
    second = await _created(core_with_fake_worker, place="b")
    others = await _created(core_with_fake_worker, member_id=2, place="a")

    response = await core_with_fake_worker.client.delete("/api/v1/members/me", headers=bearer(1))
    after = await core_with_fake_worker.create(1, "탈퇴 후 메모")
    # Each write and the record read check the member in their own statement (the token
    # alone is still valid).
    client, context_id = core_with_fake_worker.client, first["contextId"]
    writes_after = [
        await client.post(
            f"/api/v1/records/{first['recordId']}/contexts", json={"body": "더"}, headers=bearer(1)
        ),
        await client.put(
            f"/api/v1/contexts/{context_id}", json={"body": "고침"}, headers=bearer(1)
        ),
        await client.delete(f"/api/v1/contexts/{context_id}", headers=bearer(1)),
        await client.get(f"/api/v1/records/{others['recordId']}", headers=bearer(1)),
    ]

    assert response.status_code == 204
    for created in (first, second):
        assert (await facts.state(engine, created["contextId"])).statuses == (
            "CANCELLED",
            "CANCELLED",
        )
    assert (await facts.state(engine, others["contextId"])).statuses == ("PENDING", "PENDING")
    assert after.status_code == 401
    assert [w.status_code for w in writes_after] == [401, 401, 401, 401]
    contexts = await facts.count(engine, "SELECT count(*) FROM core.context WHERE member_id = 1")
    assert contexts == 2


async def test_another_members_record_and_context_answer_404_like_a_missing_id(
    core_with_fake_worker, fake_worker, engine
):
    """Object-level authorization with sequential ids: nothing written, nothing dispatched."""
    created = await _created(core_with_fake_worker)
    await _wait_dispatched(fake_worker, 1)
    record_id, context_id = created["recordId"], created["contextId"]
    missing_record, missing_context = record_id + 1000, context_id + 1000
    client, intruder = core_with_fake_worker.client, bearer(2)

    attempts = {
        "add": lambda r: client.post(
            f"/api/v1/records/{r}/contexts", json={"body": "침입"}, headers=intruder
        ),
        "delete_record": lambda r: client.delete(f"/api/v1/records/{r}", headers=intruder),
    }
    context_attempts = {
        "modify": lambda c: client.put(
            f"/api/v1/contexts/{c}", json={"body": "침입"}, headers=intruder
        ),
        "delete": lambda c: client.delete(f"/api/v1/contexts/{c}", headers=intruder),
    }
    for attempt in attempts.values():
        theirs, missing = await attempt(record_id), await attempt(missing_record)
        assert (theirs.status_code, theirs.json()) == (missing.status_code, missing.json())
        assert theirs.status_code == 404
    for attempt in context_attempts.values():
        theirs, missing = await attempt(context_id), await attempt(missing_context)
        assert (theirs.status_code, theirs.json()) == (missing.status_code, missing.json())
        assert theirs.status_code == 404

    assert await facts.count(engine, "SELECT count(*) FROM core.context") == 1
    assert not (await facts.context(engine, context_id)).deleted
    assert (await facts.state(engine, context_id)).statuses == ("PENDING", "PENDING")
    assert len(fake_worker.requests) == 1


async def test_another_members_deleted_context_is_404_not_409(core_with_fake_worker):
    created = await _created(core_with_fake_worker)
    await core_with_fake_worker.client.put(
        f"/api/v1/contexts/{created['contextId']}", json={"body": "바뀐 내용"}, headers=bearer(1)
    )

    response = await core_with_fake_worker.client.put(
        f"/api/v1/contexts/{created['contextId']}", json={"body": "침입"}, headers=bearer(2)
    )

    assert response.status_code == 404
    assert response.json() == {"detail": "context not found"}


async def test_reads_show_bodies_and_private_keywords_to_the_owner_only(
    core_with_fake_worker, engine
):
    """§9 read rules; scenario 21 (no keywords before AI finishes), scenario 4 (edit)."""
    created = await _created(core_with_fake_worker)
    context_id, record_id = created["contextId"], created["recordId"]
    await make_preset(engine, preset_id=1, code="PUBLIC_ONE", visibility="PUBLIC")
    await make_preset(engine, preset_id=2, code="PRIVATE_ONE", visibility="PRIVATE_ONLY")
    await make_preset(engine, preset_id=3, code="BLOCKED_ONE", visibility="BLOCKED")
    await make_preset(engine, preset_id=4, code="RETIRED_ONE", is_active=False)
    for keyword_id in (1, 2, 3, 4):
        await make_keyword(engine, context_id=context_id, keyword_id=keyword_id)
    url = f"/api/v1/records/{record_id}"

    not_finished = await core_with_fake_worker.client.get(url, headers=bearer(1))
    assert not_finished.status_code == 200
    assert not_finished.json()["keywords"] == []

    await set_statuses(
        engine, context_id=context_id, embedding_status="COMPLETED", keyword_status="COMPLETED"
    )
    owner = (await core_with_fake_worker.client.get(url, headers=bearer(1))).json()
    public_url = f"/api/v1/public-records/{created['publicId']}"
    other = (await core_with_fake_worker.client.get(public_url, headers=bearer(2))).json()
    owner_public = (await core_with_fake_worker.client.get(public_url, headers=bearer(1))).json()

    assert [k["code"] for k in owner["keywords"]] == ["PRIVATE_ONE", "PUBLIC_ONE"]
    assert [k["code"] for k in other["keywords"]] == ["PUBLIC_ONE"]
    assert owner["contexts"][0]["body"] == NOTE
    assert owner["publicId"] == created["publicId"]
    # The public view is the same for every member, its owner included: no ids, no bodies.
    assert other == owner_public
    assert other == {
        "publicId": created["publicId"],
        "place": owner["place"],
        "contexts": [{"createdAt": owner["contexts"][0]["createdAt"]}],
        "keywords": [k for k in owner["keywords"] if k["code"] == "PUBLIC_ONE"],
    }
    assert NOTE not in str(other)

    replaced = await core_with_fake_worker.client.put(
        f"/api/v1/contexts/{context_id}", json={"body": "새 내용"}, headers=bearer(1)
    )
    after_edit = (await core_with_fake_worker.client.get(url, headers=bearer(1))).json()
    assert after_edit["keywords"] == []
    assert [c["contextId"] for c in after_edit["contexts"]] == [replaced.json()["contextId"]]
