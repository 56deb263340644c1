"""Both services as real processes over real HTTP, a member's view (§9, §10): edits while the
worker is busy, keyword reads after edits, reads before AI finishes, concurrent edits, the
last-context guard and object-level authorization. Recovery (rescan, crashes, the finalizer)
is in ``test_two_services_recovery.py``."""

from __future__ import annotations

import asyncio

from sqlalchemy import text

from tests.core.support import embedding_deleted
from tests.e2e.conftest import OTHER, CoreApi, Services
from tests.e2e.observe import (
    StateRow,
    active_context_ids,
    context_deleted,
    count,
    keyword_ids,
    metric,
    state,
    wait_finished,
    wait_until,
)
from tests.e2e.processes import member_token
from tests.worker.support import arrived, release

NOTE = "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음."
EDITED = "친구들이랑 수다 떨기 좋은 넓은 술집. 단체석 있음."
HANGOVER = "전날 과음하고 해장하러 감. 콩나물국밥 먹고 속 풀림, 뜨끈한 국물 최고."
NEVER_EXISTED = 9_000_000_000
OUTCOMES = "pinlog_stage_outcomes_total"


async def codes(engine, keyword_ids_: set[int]) -> set[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT code FROM ai.keyword_preset WHERE id = ANY(CAST(:ids AS int[]))"),
            {"ids": sorted(keyword_ids_)},
        )
        return {row.code for row in rows}


def keyword_codes(response) -> set[str]:
    return {keyword["code"] for keyword in response.json()["keywords"]}


async def test_21_record_reads_fine_without_keywords_while_ai_is_unfinished(
    live: Services, api: CoreApi, engine, fake_openai, hold
):
    held = hold()
    fake_openai.script_embeddings(held)
    record_id, context_id = await api.created(NOTE)
    await arrived(held)

    during = await api.read(record_id)
    release(held)

    assert during.status_code == 200
    assert [c["contextId"] for c in during.json()["contexts"]] == [context_id]
    assert during.json()["contexts"][0]["body"] == NOTE
    assert during.json()["keywords"] == []
    await wait_finished(engine, [context_id])
    assert await state(engine, context_id) == StateRow("COMPLETED", "COMPLETED", 0)
    assert keyword_codes(await api.read(record_id))


async def test_1_edit_while_the_old_context_is_judged_cancels_it_and_discards_its_result(
    live: Services, api: CoreApi, engine, fake_openai, hold
):
    discarded = await metric(live.worker.base_url, OUTCOMES, stage="keyword", outcome="discarded")
    judging = hold()
    fake_openai.script_judge(judging)
    record_id, old = await api.created(NOTE)
    await arrived(judging)
    assert await state(engine, old) == StateRow("COMPLETED", "PROCESSING", 0)
    new_embedding = hold()
    fake_openai.script_embeddings(new_embedding)

    response = await api.modify(old, EDITED)
    release(judging)  # the old judgment answers after the edit committed (§10 #2)
    await arrived(new_embedding)

    assert response.status_code == 200
    new = response.json()["contextId"]
    assert new != old
    # Old: soft-deleted, both CANCELLED, vector hidden. New: its own row, nothing inherited.
    assert await context_deleted(engine, old)
    assert await state(engine, old) == StateRow("CANCELLED", "CANCELLED", 0)
    assert await embedding_deleted(engine, old) is True
    new_state = await state(engine, new)
    assert (new_state.keyword, new_state.retry_count) == ("PENDING", 0)
    assert await embedding_deleted(engine, new) is None
    assert await keyword_ids(engine, new) == set()
    await wait_until(
        lambda: _grew(live, "keyword", "discarded", discarded), what="old result discarded"
    )
    assert await keyword_ids(engine, old) == set()
    release(new_embedding)
    await wait_finished(engine, [new])
    assert await state(engine, new) == StateRow("COMPLETED", "COMPLETED", 0)
    assert await embedding_deleted(engine, new) is False
    assert await active_context_ids(engine, record_id) == [new]


async def _grew(services: Services, stage: str, outcome: str, before: float) -> bool:
    return await metric(services.worker.base_url, OUTCOMES, stage=stage, outcome=outcome) > before


async def test_4_keywords_read_after_an_edit_exclude_the_old_contexts_keywords(
    live: Services, api: CoreApi, engine, fake_openai
):
    record_id, old = await api.created(NOTE)
    await wait_finished(engine, [old])
    old_keywords = await keyword_ids(engine, old)
    assert old_keywords
    assert keyword_codes(await api.read(record_id)) == await codes(engine, old_keywords)
    fake_openai.set_judge_selection(lambda ids: [(i, 0.8) for i in ids if i not in old_keywords])

    new = (await api.modify(old, EDITED)).json()["contextId"]
    await wait_finished(engine, [new])

    new_keywords = await keyword_ids(engine, new)
    assert new_keywords
    assert not new_keywords & old_keywords
    assert await keyword_ids(engine, old) == old_keywords  # the rows remain (§9)
    assert await state(engine, old) == StateRow("CANCELLED", "CANCELLED", 0)
    assert keyword_codes(await api.read(record_id)) == await codes(engine, new_keywords)


async def test_two_concurrent_edits_of_one_context_leave_exactly_one_live_new_context(
    live: Services, api: CoreApi, engine, fake_openai
):
    record_id, original = await api.created(NOTE)
    await wait_finished(engine, [original])

    bodies = [f"{EDITED} {i}" for i in range(4)]
    responses = await asyncio.gather(*(api.modify(original, body) for body in bodies))

    assert sorted(r.status_code for r in responses) == [200, 409, 409, 409]
    ((winner, winning_body),) = [
        (r.json()["contextId"], body)
        for r, body in zip(responses, bodies, strict=True)
        if r.status_code == 200
    ]
    assert await active_context_ids(engine, record_id) == [winner]
    assert await count(engine, "SELECT count(*) FROM core.context") == 2
    assert await count(engine, "SELECT count(*) FROM ai.context_ai_state") == 2
    await wait_finished(engine, [winner])
    assert await state(engine, winner) == StateRow("COMPLETED", "COMPLETED", 0)

    # A whitespace-only edit is a no-op: the same id, no new context, nothing dispatched.
    embedded = fake_openai.embedding_calls
    same = await api.modify(winner, f"  {winning_body}\n")
    assert (same.status_code, same.json()["contextId"]) == (200, winner)
    assert await count(engine, "SELECT count(*) FROM core.context") == 2
    assert fake_openai.embedding_calls == embedded


async def test_deleting_the_last_active_context_is_refused_and_changes_nothing(
    live: Services, api: CoreApi, engine
):
    record_id, first = await api.created(NOTE)
    await wait_finished(engine, [first])

    refused = await api.delete_context(first)

    assert refused.status_code == 409
    assert not await context_deleted(engine, first)
    assert await state(engine, first) == StateRow("COMPLETED", "COMPLETED", 0)
    second = (await api.add(record_id, EDITED)).json()["contextId"]
    assert (await api.delete_context(first)).status_code == 204
    assert await state(engine, first) == StateRow("CANCELLED", "CANCELLED", 0)
    assert await embedding_deleted(engine, first) is True
    assert (await api.delete_context(second)).status_code == 409
    await wait_finished(engine, [second])
    read = await api.read(record_id)
    assert [c["contextId"] for c in read.json()["contexts"]] == [second]


async def test_another_member_reads_no_bodies_or_private_keywords_and_changes_nothing(
    live: Services, api: CoreApi, engine, fake_openai
):
    fake_openai.set_judge_selection(lambda ids: [(i, 0.8) for i in ids])
    created = (await api.create(HANGOVER)).json()
    record_id, context_id = created["recordId"], created["contextId"]
    await wait_finished(engine, [context_id])
    embedded = fake_openai.embedding_calls
    owner_view = await api.read(record_id)
    other_view = await api.read_public(created["publicId"], member=OTHER)

    attempts = [
        (api.modify(context_id, EDITED, member=OTHER), api.modify(NEVER_EXISTED, EDITED)),
        (api.delete_context(context_id, member=OTHER), api.delete_context(NEVER_EXISTED)),
        (api.delete_record(record_id, member=OTHER), api.delete_record(NEVER_EXISTED)),
        (api.add(record_id, EDITED, member=OTHER), api.add(NEVER_EXISTED, EDITED)),
        (api.read(record_id, member=OTHER), api.read(NEVER_EXISTED)),
    ]
    for theirs, missing in attempts:
        theirs, missing = await theirs, await missing
        assert theirs.status_code == missing.status_code == 404
        assert theirs.content == missing.content  # existence is not revealed

    assert other_view.status_code == 200
    assert all("body" not in c for c in other_view.json()["contexts"])
    public = await codes(engine, await _visible(engine, context_id, ("PUBLIC",)))
    private = await codes(engine, await _visible(engine, context_id, ("PRIVATE_ONLY",)))
    assert "HANGOVER_CURE" in private
    assert keyword_codes(owner_view) == public | private
    assert keyword_codes(other_view) == public
    # Nothing written, nothing dispatched.
    assert await count(engine, "SELECT count(*) FROM core.context WHERE deleted_at IS NULL") == 1
    assert await count(engine, "SELECT count(*) FROM ai.context_ai_state") == 1
    assert await state(engine, context_id) == StateRow("COMPLETED", "COMPLETED", 0)
    assert fake_openai.embedding_calls == embedded
    # A token made by `pinlog-core token` (member 3 created on the way) sees the same view.
    token = await member_token(live.command_env(), 3)
    third = await api.client.get(
        f"/api/v1/public-records/{created['publicId']}",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert third.json() == other_view.json()


async def _visible(engine, context_id: int, visibilities: tuple[str, ...]) -> set[int]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT k.keyword_id FROM ai.context_keyword k JOIN ai.keyword_preset p "
                "ON p.id = k.keyword_id WHERE k.context_id = :id AND p.is_active "
                "AND p.visibility = ANY(CAST(:v AS text[]))"
            ),
            {"id": context_id, "v": list(visibilities)},
        )
        return {row.keyword_id for row in rows}
