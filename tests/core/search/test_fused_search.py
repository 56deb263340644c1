"""Fused personal search through the core (docs/search.md; docs/contract.md §7 Additions):
the lexical list from the terms written with each note, the worker's semantic list and keyword
hits, the core's name matches, reciprocal rank fusion and the cuts on semantic-only results.
Real PostgreSQL, the real worker over HTTP with the fake OpenAI provider."""

from __future__ import annotations

from sqlalchemy import text

from core_service.repository import context_writes
from core_service.repository.db import transaction
from pinlog_platform.contract.search.fusion import LEXICAL, LIST_WEIGHTS, RRF_K
from pinlog_platform.contract.search.terms import ANALYSER_VERSION, analyse
from tests.core.harness import bearer
from tests.core.support import created_and_completed


async def _search(core, member_id, query, limit=20):
    response = await core.client.post(
        "/api/v1/search", json={"query": query, "limit": limit}, headers=bearer(member_id)
    )
    assert response.status_code == 200, response.text
    return response.json()["results"]


async def _terms(engine, context_id):
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT t.term, t.tf, d.analyser_version, d.term_count, t.member_id "
                "FROM core.context_search_term AS t "
                "JOIN core.context_search_doc AS d USING (context_id) "
                "WHERE t.context_id = :id ORDER BY t.term"
            ),
            {"id": context_id},
        )
        return [tuple(row) for row in rows]


async def test_create_add_and_edit_write_the_notes_terms_and_the_edit_purges_the_old(
    core_with_fake_worker, engine
):
    core = core_with_fake_worker
    created = (await core.create(1, "카페에서 조용했음. 카페 라떼 최고", place="a")).json()
    added = await core.client.post(
        f"/api/v1/records/{created['recordId']}/contexts",
        json={"body": "창가 자리"},
        headers=bearer(1),
    )
    first = await _terms(engine, created["contextId"])
    edited = await core.client.put(
        f"/api/v1/contexts/{created['contextId']}",
        json={"body": "빗소리 들으며"},
        headers=bearer(1),
    )

    assert [(term, tf) for term, tf, *_ in first] == [
        ("라떼", 1),
        ("조용", 1),
        ("최고", 1),
        ("카페", 2),
    ]
    assert {(version, count, member) for _, _, version, count, member in first} == {
        (ANALYSER_VERSION, 5, 1)
    }
    # The edit purged the old version's terms in its statement.
    assert await _terms(engine, created["contextId"]) == []
    assert [t for t, *_ in await _terms(engine, added.json()["contextId"])] == ["자리", "창가"]
    assert [t for t, *_ in await _terms(engine, edited.json()["contextId"])] == ["듣다", "빗소리"]


async def test_lexical_list_finds_an_inflected_word_and_never_a_deleted_or_others_note(
    core, engine
):
    cafe = await created_and_completed(core, engine, 1, "카페 창가 자리가 조용해서 좋아요", "a")
    other = await created_and_completed(core, engine, 1, "국밥 한 그릇 뜨끈하게", "b")
    gone = await created_and_completed(core, engine, 1, "카페 라떼 맛집", "c")
    await core.client.post(
        f"/api/v1/records/{gone['recordId']}/contexts",
        json={"body": "주차 가능"},
        headers=bearer(1),
    )
    deleted = await core.client.delete(f"/api/v1/contexts/{gone['contextId']}", headers=bearer(1))
    assert deleted.status_code == 204
    theirs = await created_and_completed(core, engine, 2, "카페 창가 자리", "a")

    results = await _search(core, 1, "카페에서")

    lexical = [r["recordId"] for r in results if "lexical" in r["matchedBy"]]
    assert lexical == [cafe["recordId"]]
    assert theirs["recordId"] not in {r["recordId"] for r in results}
    assert other["recordId"] not in lexical


async def test_a_note_without_a_vector_is_found_lexically_with_similarity_null(core, engine):
    """A note the worker has not embedded (written by the create statement, never
    dispatched): the lexical list finds it, the worker has no cosine for it."""
    body = "빗소리 들으면서 커피 마시기"
    terms = analyse(body)
    async with transaction(engine) as conn:
        written = await context_writes.create(
            conn,
            member_id=1,
            external_place_id="rainy",
            place_name="카페",
            body=body,
            daily_notes=0,
            terms=terms,
            analyser_version=ANALYSER_VERSION,
        )

    results = await _search(core, 1, "빗소리")

    assert results == [
        {
            "recordId": written.record_id,
            "contextId": written.context_id,
            "place": {"externalPlaceId": "rainy", "name": "카페"},
            "keywords": [],
            "similarity": None,
            "keywordMatched": False,
            "matchedBy": ["lexical"],
            "score": results[0]["score"],
        }
    ]
    assert results[0]["score"] == LIST_WEIGHTS[LEXICAL] / (RRF_K + 1)


async def test_the_cuts_drop_only_semantic_only_results(make_core, worker, engine):
    """With a floor no cosine reaches, a semantic-only result is cut, a lexical one stays."""
    async with make_core(
        str(worker.client.base_url),
        search_similarity_floor=0.999,
        search_similarity_floor_word=0.999,
    ) as core:
        cafe = await created_and_completed(core, engine, 1, "카페 창가 자리", "a")
        await created_and_completed(core, engine, 1, "국밥 한 그릇", "b")

        results = await _search(core, 1, "카페")

    assert [(r["recordId"], r["matchedBy"][0]) for r in results] == [(cafe["recordId"], "lexical")]


async def test_uncut_semantic_results_follow_the_lexical_match_by_fused_score(core, engine):
    cafe = await created_and_completed(core, engine, 1, "카페 창가 자리", "a")
    soup = await created_and_completed(core, engine, 1, "국밥 한 그릇", "b")

    results = await _search(core, 1, "카페")

    assert [r["recordId"] for r in results] == [cafe["recordId"], soup["recordId"]]
    assert results[0]["matchedBy"][:2] == ["lexical", "semantic"]
    assert results[1]["matchedBy"] == ["semantic"]
    assert results[0]["score"] > results[1]["score"]
    assert all(isinstance(r["similarity"], float) for r in results)


async def _keywords(engine, context_id, *keyword_ids):
    """The note's judgment replaced by these keywords (confidence 0.9)."""
    async with engine.begin() as conn:
        await conn.execute(
            text("DELETE FROM ai.context_keyword WHERE context_id = :id"), {"id": context_id}
        )
        for keyword_id in keyword_ids:
            await conn.execute(
                text(
                    "INSERT INTO ai.context_keyword (context_id, keyword_id, confidence, "
                    "preset_version) VALUES (:id, :k, 0.9, 1)"
                ),
                {"id": context_id, "k": keyword_id},
            )


async def test_keyword_list_finds_a_record_by_a_preset_the_query_names(core, engine):
    """ "혼술" names the PRIVATE_ONLY preset SOLO_DRINKING (26) by its display name: the owner's
    record carrying it is found by keyword though its note has neither word; another member's
    is not, nor a record carrying only the BLOCKED preset RUDE_SERVICE (21) for "불친절"."""
    bar = await created_and_completed(core, engine, 1, "바 자리 분위기 최고", "bar")
    rude = await created_and_completed(core, engine, 1, "다시 갈 일은 없을 듯", "rude")
    theirs = await created_and_completed(core, engine, 2, "바 자리 분위기 최고", "bar")
    await _keywords(engine, bar["contextId"], 26)
    await _keywords(engine, rude["contextId"], 21)
    await _keywords(engine, theirs["contextId"], 26)

    solo = await _search(core, 1, "혼술")
    blocked = await _search(core, 1, "불친절")

    (found,) = [r for r in solo if r["recordId"] == bar["recordId"]]
    assert "keyword" in found["matchedBy"] and "lexical" not in found["matchedBy"]
    assert theirs["recordId"] not in {r["recordId"] for r in solo}
    assert all("keyword" not in r["matchedBy"] for r in blocked)
    assert solo[0]["recordId"] == bar["recordId"]


async def test_a_deleted_records_notes_are_never_matched_by_their_words(core, engine):
    """§10 #3 for the lexical list: the terms of a deleted record's notes stay in the index,
    the lexical query checks liveness."""
    kept = await created_and_completed(core, engine, 1, "카페 창가 자리", "a")
    gone = await created_and_completed(core, engine, 1, "카페 라떼", "b")
    deleted = await core.client.delete(f"/api/v1/records/{gone['recordId']}", headers=bearer(1))
    assert deleted.status_code == 204

    results = await _search(core, 1, "카페")

    assert [(r["recordId"], r["matchedBy"][0]) for r in results] == [(kept["recordId"], "lexical")]


async def test_each_result_shows_its_place_and_the_keywords_its_owner_sees(
    core, engine, fake_openai
):
    """Read with the re-check (one statement, §7; the round trips stay pinned): the name the
    record's owner gave (not the first name another member gave the place) and the owner's
    keywords, PRIVATE_ONLY ones included, exactly as the record read shows them."""
    fake_openai.set_judge_selection(lambda ids: [(i, 0.8) for i in ids])
    await created_and_completed(core, engine, 2, "해장하러 간 국밥집", "soup")
    mine = await core.client.post(
        "/api/v1/records",
        json={"externalPlaceId": "soup", "placeName": "우리 동네 국밥", "body": "해장 국밥 최고"},
        headers=bearer(1),
    )
    assert mine.status_code == 201
    await created_and_completed(core, engine, 1, "해장 국밥 또 먹음", "soup")
    read = await core.client.get(f"/api/v1/records/{mine.json()['recordId']}", headers=bearer(1))

    (result,) = [
        r for r in await _search(core, 1, "해장 국밥") if r["recordId"] == read.json()["recordId"]
    ]

    assert result["place"] == {"externalPlaceId": "soup", "name": "우리 동네 국밥"}
    assert result["keywords"] == read.json()["keywords"]
    visibilities = await _visibilities(engine, [k["code"] for k in result["keywords"]])
    assert "PRIVATE_ONLY" in visibilities  # the owner's view, not the public one


async def _visibilities(engine, codes):
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT visibility FROM ai.keyword_preset WHERE code = ANY(:codes)"),
            {"codes": codes},
        )
        return {row.visibility for row in rows}
