"""Nothing stale in the lexical index (docs/search.md "Lexical"): every statement that makes a
context non-live (a delete, an edit's old version, a record delete, a withdrawal, a
``retry-failed`` replacement) purges its index rows in the same statement; a reindex batch
never writes terms for a context deleted while it waited; what a race or an older version left
is purged by ``pinlog-core reindex search``'s sweep, beside concurrent edits and deletes; the
coverage ``status`` shows counts live contexts only. Real PostgreSQL, real concurrent
transactions."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import text

from core_service.operations.retry_failed import FailedReplacer, Selection
from core_service.operations.search_reindex import reindex
from core_service.repository import context_search, context_writes
from core_service.repository.db import create_engine
from core_service.service.search_terms import SearchAnalyser
from core_service.service.status import read_status
from pinlog_platform.contract.search.terms import ANALYSER_VERSION, analyse
from tests.core.harness import bearer
from tests.worker.open_transactions import finished_behind_lock, lock_waiters_reach
from tests.worker.support import set_statuses

# Index rows by liveness: the contexts holding a document row, and whether each is live (the
# context, its record and its member not deleted); terms of contexts without a document row.
INDEXED = text(
    """
    SELECT d.context_id,
           c.deleted_at IS NULL AND r.deleted_at IS NULL AND m.deleted_at IS NULL AS live,
           (SELECT count(*) FROM core.context_search_term AS t
            WHERE t.context_id = d.context_id) AS terms
    FROM core.context_search_doc AS d
    JOIN core.context AS c ON c.id = d.context_id
    JOIN core.record AS r ON r.id = c.record_id
    JOIN core.member AS m ON m.id = c.member_id
    ORDER BY d.context_id
    """
)
LIVE_CONTEXTS = text(
    """
    SELECT c.id FROM core.context AS c
    JOIN core.record AS r ON r.id = c.record_id
    JOIN core.member AS m ON m.id = c.member_id
    WHERE c.deleted_at IS NULL AND r.deleted_at IS NULL AND m.deleted_at IS NULL
    ORDER BY c.id
    """
)


async def _index(engine) -> tuple[dict[int, bool], list[int]]:
    """``({indexed context: live}, live contexts)``."""
    async with engine.connect() as conn:
        indexed = {int(r.context_id): bool(r.live) for r in await conn.execute(INDEXED)}
        live = [int(i) for i in (await conn.execute(LIVE_CONTEXTS)).scalars()]
    return indexed, live


async def _stale(engine) -> list[int]:
    indexed, _ = await _index(engine)
    return sorted(i for i, live in indexed.items() if not live)


async def _coverage(engine) -> tuple[int, int]:
    """``search_index`` as ``pinlog-core status --json`` reads it: ``(indexed, total)``."""
    report = await read_status(
        engine, processing_expiry_seconds=300, analyser_version=ANALYSER_VERSION
    )
    assert report.search_index is not None
    return report.search_index["indexed"], report.search_index["total"]


async def _edit(core, context_id: int, body: str, member: int = 1):
    return await core.client.put(
        f"/api/v1/contexts/{context_id}", json={"body": body}, headers=bearer(member)
    )


async def _delete(core, context_id: int, member: int = 1):
    return await core.client.delete(f"/api/v1/contexts/{context_id}", headers=bearer(member))


async def _add(core, record_id: int, body: str, member: int = 1) -> int:
    response = await core.client.post(
        f"/api/v1/records/{record_id}/contexts", json={"body": body}, headers=bearer(member)
    )
    assert response.status_code == 201, response.text
    return response.json()["contextId"]


async def _ended_every_way(core, engine) -> list[int]:
    """Contexts of member 1 and 2 ended by each path; their ids, in id order."""
    a = (await core.create(1, "카페 창가 라떼", place="a")).json()
    a2 = await _add(core, a["recordId"], "국밥 국물 뜨끈")
    assert (await _edit(core, a["contextId"], "카페 창가 녹차")).status_code == 200
    assert (await _delete(core, a2)).status_code == 204
    b = (await core.create(1, "바다 산책 노을", place="b")).json()
    b2 = await _add(core, b["recordId"], "바다 모래")
    response = await core.client.delete(f"/api/v1/records/{b['recordId']}", headers=bearer(1))
    assert response.status_code == 204
    c = (await core.create(1, "혼술 하이볼 안주", place="c")).json()
    await set_statuses(
        engine, context_id=c["contextId"], embedding_status="FAILED", keyword_status="CANCELLED"
    )
    replacer = FailedReplacer(engine, core.app.state.dispatcher, core.app.state.metrics)
    (replacement,) = (await replacer.replace(Selection(member_id=1))).replaced
    assert replacement.old_id == c["contextId"]
    d = (await core.create(2, "공원 벤치 독서", place="d")).json()
    assert (await core.client.delete("/api/v1/members/me", headers=bearer(2))).status_code == 204
    return sorted([a["contextId"], a2, b["contextId"], b2, c["contextId"], d["contextId"]])


async def test_every_path_that_ends_a_context_purges_its_index_rows(core_with_fake_worker, engine):
    """A delete, an edit (the old version), a record delete, a ``retry-failed`` replacement
    and a withdrawal each leave no document or term row of the context they end; the live
    contexts keep theirs, and the coverage counts the live ones."""
    ended = await _ended_every_way(core_with_fake_worker, engine)

    indexed, live = await _index(engine)
    async with engine.connect() as conn:
        orphan_terms = (
            await conn.execute(
                text(
                    "SELECT count(*) FROM core.context_search_term "
                    "WHERE context_id = ANY(CAST(:ids AS bigint[]))"
                ),
                {"ids": ended},
            )
        ).scalar_one()
    assert [i for i in ended if i in indexed] == []
    assert orphan_terms == 0
    assert sorted(indexed) == live and all(indexed.values())
    assert len(live) == 2  # a's new version and c's replacement
    assert await _coverage(engine) == (2, 2)


@pytest.mark.parametrize("first", ["edit", "delete"])
async def test_an_edit_racing_a_delete_leaves_only_live_rows(first, core_with_fake_worker, engine):
    """An edit and a delete of one context take their snapshots, then queue on its record's
    lock (held by another transaction), ``first`` ahead. Released, the first wins; the other
    answers 409; the index holds the live contexts' rows only (the edit's new context when it
    won), whichever purged the old one."""
    core = core_with_fake_worker
    created = (await core.create(1, "카페 창가 라떼", place="a")).json()
    other = await _add(core, created["recordId"], "국밥 국물")
    old = created["contextId"]
    async with engine.connect() as holder:
        transaction = await holder.begin()
        await holder.execute(
            text("SELECT 1 FROM core.record WHERE id = :id FOR UPDATE"),
            {"id": created["recordId"]},
        )
        calls = {
            "edit": lambda: _edit(core, old, "카페 테라스 녹차"),
            "delete": lambda: _delete(core, old),
        }
        winner = asyncio.create_task(calls[first]())
        await lock_waiters_reach(engine, 1)
        loser = asyncio.create_task(calls["delete" if first == "edit" else "edit"]())
        await lock_waiters_reach(engine, 2)
        await transaction.rollback()
    won, lost = await winner, await loser

    assert won.status_code == (200 if first == "edit" else 204), won.text
    assert lost.status_code == 409, lost.text
    indexed, live = await _index(engine)
    expected = sorted([other] + ([won.json()["contextId"]] if first == "edit" else []))
    assert live == expected
    assert sorted(indexed) == expected and all(indexed.values())
    assert await _coverage(engine) == (len(expected), len(expected))


async def test_a_batch_never_writes_terms_for_a_context_deleted_while_it_waited(
    core_with_fake_worker, engine
):
    """A delete holds the context (its transaction open); a reindex batch for that context
    waits on the context's lock, then sees it deleted and writes nothing for it."""
    core = core_with_fake_worker
    created = (await core.create(1, "카페 창가 라떼", place="a")).json()
    await _add(core, created["recordId"], "국밥 국물")
    old = created["contextId"]
    async with engine.connect() as deleter:
        transaction = await deleter.begin()
        outcome = await context_writes.delete(deleter, member_id=1, context_id=old)
        assert outcome.deleted

        async def batch() -> int:
            async with engine.begin() as conn:
                return await context_search.replace_terms(
                    conn, terms={old: analyse("카페 창가 라떼")}, analyser_version="v-next"
                )

        written = await finished_behind_lock(engine, batch(), transaction.commit)

    assert written == 0
    assert await _stale(engine) == []


async def test_a_delete_waiting_for_a_batch_leaves_a_row_that_the_sweep_purges(
    core_with_fake_worker, engine
):
    """A batch writes the first terms of a context (one written before the index existed)
    while a delete of it waits on the batch's lock: the delete's snapshot, older than the
    batch's commit, cannot see the new document, so it stays; the reindex's sweep purges it."""
    core = core_with_fake_worker
    created = (await core.create(1, "카페 창가 라떼", place="a")).json()
    await _add(core, created["recordId"], "국밥 국물")
    old = created["contextId"]
    async with engine.begin() as conn:
        await conn.execute(
            text("DELETE FROM core.context_search_doc WHERE context_id = :id"), {"id": old}
        )
    async with engine.connect() as batch:
        transaction = await batch.begin()
        written = await context_search.replace_terms(
            batch, terms={old: analyse("카페 창가 라떼")}, analyser_version=ANALYSER_VERSION
        )
        deleted = await finished_behind_lock(engine, _delete(core, old), transaction.commit)
    assert (written, deleted.status_code) == (1, 204)
    assert await _stale(engine) == [old]

    report = await reindex(engine, SearchAnalyser(), rate=10_000)

    assert report.purged == 1
    assert await _stale(engine) == []
    assert (report.covered, report.total) == (1, 1)


async def test_reindex_purges_leftovers_beside_concurrent_edits_and_deletes(
    core_with_fake_worker, engine, migrated_database
):
    """An index from before the purge: the non-live contexts ended every way still hold their
    rows. Two reindex runs (small sweep pages) go beside members editing and deleting; after
    them no row of a non-live context is left, every live one is indexed, and the coverage
    counts live contexts only."""
    core = core_with_fake_worker
    ended = await _ended_every_way(core, engine)
    async with engine.begin() as conn:
        owners = dict(
            (
                await conn.execute(
                    text("SELECT id, member_id FROM core.context WHERE id = ANY(:ids)"),
                    {"ids": ended},
                )
            ).all()
        )
        for context_id in ended:  # as the index was before: their rows stayed
            await context_search.insert_terms(
                conn,
                context_id=context_id,
                member_id=owners[context_id],
                terms=analyse("카페 바다 국밥"),
                analyser_version=ANALYSER_VERSION,
            )
    assert await _stale(engine) == ended
    more = [(await core.create(1, f"메모 {i} 카페", place=f"m{i}")).json() for i in range(6)]
    for note in more:
        await _add(core, note["recordId"], "두 번째 메모")
    async with engine.begin() as conn:  # an analyser upgrade: every live context to rewrite
        await conn.execute(
            text(
                "UPDATE core.context_search_doc SET analyser_version = 'kiwipiepy-0.0/old' "
                "WHERE NOT (context_id = ANY(:ids))"
            ),
            {"ids": ended},
        )

    async def members_write() -> None:
        for note in more[:3]:
            assert (await _edit(core, note["contextId"], "고친 메모 국밥")).status_code == 200
        for note in more[3:]:
            assert (await _delete(core, note["contextId"])).status_code == 204

    analyser = SearchAnalyser()
    engines = [create_engine(migrated_database, pool_size=1) for _ in range(2)]
    try:
        reports = await asyncio.gather(
            reindex(engines[0], analyser, rate=10_000, batch=2, sweep_page=2),
            reindex(engines[1], analyser, rate=10_000, batch=3, sweep_page=3),
            members_write(),
        )
    finally:
        for one in engines:
            await one.dispose()

    indexed, live = await _index(engine)
    assert await _stale(engine) == []
    assert sorted(indexed) == live
    assert reports[0].purged + reports[1].purged >= len(ended)
    assert reports[0].indexed + reports[1].indexed > 0
    assert await _coverage(engine) == (len(live), len(live))
    again = await reindex(engine, analyser, rate=10_000)
    assert (again.indexed, again.purged, again.covered, again.total) == (
        0,
        0,
        len(live),
        len(live),
    )
