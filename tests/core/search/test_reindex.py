"""``pinlog-core reindex search`` (core_service/operations/search_reindex.py): contexts without
terms (written before the migration) and contexts whose terms are of another analyser version
are indexed, while members edit and delete notes and a second run goes at the same time; at the
end every live context carries exactly its body's terms under the analyser in use."""

from __future__ import annotations

import asyncio

from sqlalchemy import text

from core_service.operations.search_reindex import reindex
from core_service.repository import context_search
from core_service.repository.db import create_engine
from core_service.service.search_terms import SearchAnalyser
from pinlog_platform.contract.search.terms import ANALYSER_VERSION, analyse
from tests.core.harness import bearer
from tests.worker.open_transactions import finished_behind_lock

BODIES = [f"카페 {i}번째 메모, 조용한 창가 자리와 라떼" for i in range(30)]

LIVE_TERMS = text(
    """
    SELECT c.id, c.body, d.analyser_version, d.term_count,
           coalesce((SELECT array_agg(t.term || ':' || t.tf ORDER BY t.term)
                     FROM core.context_search_term AS t
                     WHERE t.context_id = c.id AND t.member_id = c.member_id), '{}') AS terms
    FROM core.context AS c
    JOIN core.record AS r ON r.id = c.record_id
    LEFT JOIN core.context_search_doc AS d ON d.context_id = c.id
    WHERE c.deleted_at IS NULL AND r.deleted_at IS NULL
    ORDER BY c.id
    """
)


def _expected(body: str) -> list[str]:
    terms = analyse(body)
    return [f"{t}:{n}" for t, n in zip(terms.terms, terms.counts, strict=True)]


async def test_reindex_beside_edits_deletes_and_another_run(
    core_with_fake_worker, engine, migrated_database
):
    core = core_with_fake_worker
    ids = []
    for i, body in enumerate(BODIES):
        response = await core.create(1, body, place=f"place-{i % 10}")
        ids.append(response.json()["contextId"])
    async with engine.begin() as conn:
        # Ten contexts from before the migration (no terms), ten of an older analyser.
        await conn.execute(
            text("DELETE FROM core.context_search_doc WHERE context_id = ANY(:ids)"),
            {"ids": ids[:10]},
        )
        await conn.execute(
            text(
                "UPDATE core.context_search_doc SET analyser_version = 'kiwipiepy-0.0/old' "
                "WHERE context_id = ANY(:ids)"
            ),
            {"ids": ids[10:20]},
        )
        await conn.execute(
            text("UPDATE core.context_search_term SET tf = 9 WHERE context_id = ANY(:ids)"),
            {"ids": ids[10:20]},
        )
        await conn.execute(
            text(
                "INSERT INTO core.context_search_term (member_id, term, context_id, tf) "
                "SELECT 1, 'stale', unnest(CAST(:ids AS bigint[])), 1"
            ),
            {"ids": ids[10:20]},
        )
    analyser = SearchAnalyser()
    reindex_engines = [create_engine(migrated_database, pool_size=1) for _ in range(2)]

    async def members_write() -> None:
        for context_id in (ids[0], ids[11], ids[25]):
            response = await core.client.put(
                f"/api/v1/contexts/{context_id}", json={"body": "고친 메모 국밥"}, headers=bearer(1)
            )
            assert response.status_code == 200
        for context_id in (ids[1], ids[12]):
            response = await core.client.delete(f"/api/v1/contexts/{context_id}", headers=bearer(1))
            assert response.status_code == 204

    try:
        reports = await asyncio.gather(
            reindex(reindex_engines[0], analyser, rate=10_000, batch=2),
            reindex(reindex_engines[1], analyser, rate=10_000, batch=3),
            members_write(),
        )
    finally:
        for reindex_engine in reindex_engines:
            await reindex_engine.dispose()

    async with engine.connect() as conn:
        rows = (await conn.execute(LIVE_TERMS)).all()
    assert len(rows) == 28  # 30 created, 2 deleted (edits replace)
    wrong = [
        row.id
        for row in rows
        if row.analyser_version != ANALYSER_VERSION
        or list(row.terms) != _expected(row.body)
        or row.term_count != analyse(row.body).length
    ]
    assert wrong == []
    assert reports[0].indexed + reports[1].indexed >= 18  # the 20 less those deleted or edited
    again = await reindex(engine, analyser, rate=10_000)
    assert (again.indexed, again.covered, again.total) == (0, 28, 28)


async def test_two_term_replacements_of_one_context_serialise_on_its_document_row(
    core_with_fake_worker, engine
):
    """A replacement holds the context's document row until it commits; another replacement
    of the same context waits for it, then writes its own terms whole (no duplicate key, no
    mix of the two term sets)."""
    created = (await core_with_fake_worker.create(1, "카페 라떼", place="a")).json()
    context_id = created["contextId"]
    first = {context_id: analyse("국밥 국물")}
    second = {context_id: analyse("바다 산책 노을")}
    async with engine.connect() as holder:
        transaction = await holder.begin()
        await context_search.replace_terms(holder, terms=first, analyser_version="v-first")

        async def replace_second() -> int:
            async with engine.begin() as conn:
                return await context_search.replace_terms(
                    conn, terms=second, analyser_version=ANALYSER_VERSION
                )

        written = await finished_behind_lock(engine, replace_second(), transaction.commit)

    async with engine.connect() as conn:
        rows = (await conn.execute(LIVE_TERMS)).all()
    assert written == 1
    assert [(r.id, r.analyser_version, list(r.terms)) for r in rows] == [
        (context_id, ANALYSER_VERSION, _expected("바다 산책 노을"))
    ]
