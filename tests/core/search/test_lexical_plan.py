"""The lexical index's plans (docs/search.md): the core's search statement reads the term index
for one member's rows and the given terms only, never a sequential scan of the term or
document tables, however many notes other members have; the statements that purge the index
(a soft delete's, ``reindex search``'s sweep) find their rows by key."""

from __future__ import annotations

from sqlalchemy import text

from core_service.repository.context import SOFT_DELETE_CONTEXTS
from core_service.repository.context_search import PURGE_STALE, SEARCH_LISTS

# Member 2: 3,000 notes, each with the term 카페 and four of its own; member 1: three notes.
SEED = [
    "INSERT INTO core.place (external_place_id, name) VALUES ('plan-a', 'a'), ('plan-b', 'b')",
    """INSERT INTO core.record (member_id, place_id, place_name)
       SELECT m, p.id, 'x' FROM (VALUES (1, 'plan-a'), (2, 'plan-b')) AS v(m, ext)
       JOIN core.place AS p ON p.external_place_id = v.ext""",
    """INSERT INTO core.context (record_id, member_id, body, origin_created_at)
       SELECT r.id, r.member_id, 'note ' || g, now()
       FROM core.record AS r
       CROSS JOIN LATERAL generate_series(1, CASE r.member_id WHEN 1 THEN 3 ELSE 3000 END) AS g
       WHERE r.member_id IN (1, 2)""",
    """INSERT INTO core.context_search_doc (context_id, member_id, analyser_version, term_count)
       SELECT id, member_id, 'v', 5 FROM core.context""",
    """INSERT INTO core.context_search_term (member_id, term, context_id, tf)
       SELECT member_id, t, id, 1 FROM core.context
       CROSS JOIN LATERAL unnest(ARRAY['카페', 'a' || id, 'b' || id, 'c' || id, 'd' || id]) AS t""",
    "ANALYZE core.context, core.record, core.context_search_doc, core.context_search_term",
]


def assert_documents_read_by_index(nodes: list[dict], *, at_most: int) -> None:
    """The plan reads ``context_search_doc`` and ``context``, each by an index and each at
    most ``at_most`` rows (all loops)."""
    scans = [
        n
        for n in nodes
        if n.get("Relation Name") in ("context_search_doc", "context")
        and n["Node Type"] != "ModifyTable"
    ]
    assert {n["Relation Name"] for n in scans} == {"context_search_doc", "context"}
    assert all("Index" in n["Node Type"] for n in scans), [
        (n["Relation Name"], n["Node Type"]) for n in scans
    ]
    assert all(n["Actual Rows"] * n["Actual Loops"] <= at_most for n in scans), scans


def _nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", ()):
        yield from _nodes(child)


async def test_the_lexical_list_reads_one_members_rows_by_index(engine, members):
    async with engine.begin() as conn:
        for statement in SEED:
            await conn.execute(text(statement))
        params = {"member_id": 1, "terms": ["카페"], "named_ids": [], "k1": 1.2, "b": 0.75,
                  "floor_share": 0.95, "limit": 20}  # fmt: skip
        explained = await conn.execute(
            text("EXPLAIN (ANALYZE, FORMAT JSON) " + SEARCH_LISTS.text), params
        )
        plan = explained.scalar_one()[0]["Plan"]
        found = (await conn.execute(SEARCH_LISTS, params)).all()

    nodes = list(_nodes(plan))
    by_relation = {}
    for node in nodes:
        if node.get("Relation Name") in ("context_search_term", "context_search_doc"):
            by_relation.setdefault(node["Relation Name"], []).append(node)
    assert set(by_relation) == {"context_search_term", "context_search_doc"}
    for relation, scans in by_relation.items():
        assert all("Index" in scan["Node Type"] for scan in scans), (relation, scans)
    # Only member 1's rows come out of each scan (3 notes, one term row each of 카페).
    for scans in by_relation.values():
        assert all(scan["Actual Rows"] * scan["Actual Loops"] <= 3 for scan in scans), scans
    assert len(found) == 1  # one record of member 1


async def test_the_sweep_reads_one_page_of_documents_by_index(engine, members):
    """``reindex search``'s sweep (``PURGE_STALE``) reads a page of documents from the primary
    key and looks each context, record and member up by key: never a scan of the index or
    context tables, however many notes there are (3,003 here, a page of 100)."""
    async with engine.begin() as conn:
        for statement in SEED:
            await conn.execute(text(statement))
        await conn.execute(
            text("UPDATE core.context SET deleted_at = now() WHERE member_id = 2 AND id % 2 = 0")
        )
        await conn.execute(text("ANALYZE core.context"))
        stale = await conn.scalar(
            text(
                "SELECT count(*) FROM (SELECT id, deleted_at FROM core.context "
                "ORDER BY id LIMIT 100) AS first_page WHERE deleted_at IS NOT NULL"
            )
        )
    async with engine.connect() as conn:
        transaction = await conn.begin()
        explained = await conn.execute(
            text("EXPLAIN (ANALYZE, FORMAT JSON) " + PURGE_STALE.text),
            {"after_id": 0, "page": 100},
        )
        await transaction.rollback()
    plan = explained.scalar_one()[0]["Plan"]
    nodes = list(_nodes(plan))

    # (core.record holds two rows here: the planner may read it whole.)
    assert_documents_read_by_index(nodes, at_most=100)
    purged = [n for n in nodes if n.get("Operation") == "Delete"]
    assert stale > 0 and [n["Actual Rows"] for n in purged] == [stale]


async def test_a_soft_delete_purges_its_contexts_documents_by_key(engine, members):
    """The statement that soft-deletes contexts (a record delete, a withdrawal,
    ``retry-failed``) finds their search documents by the primary key: five contexts of 3,003
    read five document rows (their terms go by the foreign key's cascade, which looks them up
    by ``context_search_term_context_idx``)."""
    async with engine.begin() as conn:
        for statement in SEED:
            await conn.execute(text(statement))
    async with engine.connect() as conn:
        transaction = await conn.begin()
        ids = list(
            (
                await conn.execute(
                    text("SELECT id FROM core.context WHERE member_id = 2 ORDER BY id LIMIT 5")
                )
            ).scalars()
        )
        explained = await conn.execute(
            text("EXPLAIN (ANALYZE, FORMAT JSON) " + SOFT_DELETE_CONTEXTS.text),
            {"context_ids": ids},
        )
        left = await conn.scalar(
            text(
                "SELECT count(*) FROM core.context_search_term "
                "WHERE context_id = ANY(CAST(:ids AS bigint[]))"
            ),
            {"ids": ids},
        )
        await transaction.rollback()
    nodes = list(_nodes(explained.scalar_one()[0]["Plan"]))

    assert_documents_read_by_index(nodes, at_most=5)
    assert left == 0
