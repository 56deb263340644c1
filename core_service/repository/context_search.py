"""``core.context_search_doc`` and ``core.context_search_term``: the lexical index of personal
search (docs/search.md; migration 0080).

Terms are written with the context (``NEW_SEARCH_TERMS``, a fragment of the create, add and
edit statements of ``context_writes``), by ``insert_terms`` in a step-by-step transaction, and
replaced by ``pinlog-core reindex search``. They are purged in the statement that makes their
context non-live (``PURGED_SEARCH_TERMS``, a fragment of every statement that soft-deletes a
context), and ``reindex search`` purges what is left of non-live contexts (``PURGE_STALE``).
Search's lists (``SEARCH_LISTS``) score one
member's live contexts BM25-style and find the records carrying a named preset; its re-check
(``SEARCH_RECHECK``) keeps the member's live contexts and reads what each result shows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from core_service.repository.record_view import VISIBLE_KEYWORDS, KeywordView, decode_json_list
from pinlog_platform.contract.keyword_reads import keywords_shown
from pinlog_platform.contract.search.lexical import BM25_B, BM25_K1
from pinlog_platform.contract.search.terms import Terms

# A context's terms from a CTE `new_context` (id) holding at most one row; parameters
# :member_id, :analyser_version, :term_count, :terms (varchar[]), :term_counts (int[]).
# Words the statements quote that are not statuses: the lists' names and preset visibilities.
NON_STATUS_LITERALS = frozenset({"lexical", "keyword", "PUBLIC", "PRIVATE_ONLY"})

NEW_SEARCH_TERMS = """
    new_search_doc AS (
        INSERT INTO core.context_search_doc (context_id, member_id, analyser_version, term_count)
        SELECT id, CAST(:member_id AS bigint), CAST(:analyser_version AS varchar),
               CAST(:term_count AS int)
        FROM new_context
        RETURNING context_id
    ),
    new_search_terms AS (
        INSERT INTO core.context_search_term (member_id, term, context_id, tf)
        SELECT CAST(:member_id AS bigint), t.term, d.context_id, t.tf
        FROM new_search_doc AS d,
             unnest(CAST(:terms AS varchar[]), CAST(:term_counts AS int[])) AS t(term, tf)
    )"""

INSERT_TERMS = text(
    """
    WITH new_context AS (SELECT CAST(:context_id AS bigint) AS id),"""
    + NEW_SEARCH_TERMS
    + """
    SELECT 1
    """
)


def term_parameters(terms: Terms, analyser_version: str) -> dict[str, object]:
    """The parameters ``NEW_SEARCH_TERMS`` reads (besides ``member_id``)."""
    return {
        "analyser_version": analyser_version,
        "term_count": terms.length,
        "terms": list(terms.terms),
        "term_counts": list(terms.counts),
    }


# The index rows of the contexts soft-deleted in a CTE `deleted` (id), in the same statement:
# the document rows here, their terms by the foreign key's cascade (run at the end of the
# statement with a new snapshot, so it also removes terms a reindex committed after this
# statement's snapshot, looked up by context_search_term_context_idx). Selecting from `deleted`
# takes the document rows after the context's lock (docs/lock-order.md). A document row a
# reindex *inserted* after this statement's snapshot is not visible here: the reindex's sweep
# (``PURGE_STALE``) removes it.
PURGED_SEARCH_TERMS = """
    purged_search_docs AS (
        DELETE FROM core.context_search_doc AS d
        USING deleted WHERE d.context_id = deleted.id
    )"""


async def insert_terms(
    conn: AsyncConnection, *, context_id: int, member_id: int, terms: Terms, analyser_version: str
) -> None:
    """The terms of a context just inserted in this transaction."""
    params = {"context_id": context_id, "member_id": member_id}
    await conn.execute(INSERT_TERMS, params | term_parameters(terms, analyser_version))


# BM25 (docs/search.md "Lexical"): the collection statistics are the member's analysed
# contexts, which are its live ones (a context's rows are purged when it stops being live,
# PURGED_SEARCH_TERMS; what a race leaves, `reindex search` purges): the count
# and mean length read by an index-only scan of the member index, each term's document
# frequency from the primary key range (member_id, term) of the query's terms; idf = ln(1 +
# (N - df + 0.5) / (df + 0.5)). Only the hits whose context and record are live (not deleted;
# a withdrawal deletes every record) are scored, the best context per record, best first, ties
# by record id; only records scoring at least :floor_share of the best record's score are kept
# (BM25's scale grows with the member's notes: a share, not a constant).
#
# The name matches (docs/search.md "Keyword"): the member's live records with a keyword the
# owner may see (§9: shown by keywords_shown, the preset active and PUBLIC or PRIVATE_ONLY)
# among :named_ids, each record's best such context by confidence (then the newest), best
# confidence first. Both lists in one round trip, `kind` telling them apart.
SEARCH_LISTS = text(
    """
    WITH stats AS MATERIALIZED (
        SELECT CAST(count(*) AS float8) AS n,
               greatest(CAST(avg(term_count) AS float8), 1) AS mean_length
        FROM core.context_search_doc
        WHERE member_id = :member_id AND cardinality(CAST(:terms AS varchar[])) > 0
    ),
    hits AS (
        SELECT t.term, t.tf, t.context_id
        FROM core.context_search_term AS t
        WHERE t.member_id = :member_id AND t.term = ANY(CAST(:terms AS varchar[]))
    ),
    frequency AS (
        SELECT term, count(*) AS df FROM hits GROUP BY term
    ),
    live AS (
        SELECT hits.term, hits.tf, c.id AS context_id, c.record_id, d.term_count
        FROM hits
        JOIN core.context AS c ON c.id = hits.context_id
        JOIN core.record AS r ON r.id = c.record_id
        JOIN core.context_search_doc AS d ON d.context_id = c.id
        WHERE c.member_id = :member_id AND r.member_id = :member_id
          AND c.deleted_at IS NULL AND r.deleted_at IS NULL
    ),
    scored AS (
        SELECT live.record_id, live.context_id,
               sum(ln(1 + (stats.n - frequency.df + 0.5) / (frequency.df + 0.5))
                   * live.tf * (params.k1 + 1)
                   / (live.tf + params.k1 * (1 - params.b
                                             + params.b * live.term_count / stats.mean_length)))
                   AS score
        FROM live JOIN frequency USING (term) CROSS JOIN stats
        CROSS JOIN (SELECT CAST(:k1 AS float8) AS k1, CAST(:b AS float8) AS b) AS params
        GROUP BY live.record_id, live.context_id
    ),
    lexical AS (
        SELECT record_id, context_id, score FROM (
            SELECT record_id, context_id, score, max(score) OVER () AS top FROM (
                SELECT DISTINCT ON (record_id) record_id, context_id, score
                FROM scored
                ORDER BY record_id, score DESC, context_id DESC
            ) AS per_record
        ) AS best
        WHERE score > 0 AND score >= CAST(:floor_share AS float8) * top
        ORDER BY score DESC, record_id
        LIMIT :limit
    ),
    named AS (
        SELECT record_id, context_id, confidence FROM (
            SELECT DISTINCT ON (c.record_id) c.record_id, c.id AS context_id,
                   coalesce(CAST(ck.confidence AS float8), 0) AS confidence
            FROM core.context AS c
            JOIN core.record AS r ON r.id = c.record_id
            JOIN ai.context_ai_state AS s ON s.context_id = c.id
            JOIN ai.context_keyword AS ck ON ck.context_id = c.id
            JOIN ai.keyword_preset AS kp ON kp.id = ck.keyword_id
            WHERE c.member_id = :member_id AND r.member_id = :member_id
              AND c.deleted_at IS NULL AND r.deleted_at IS NULL
              AND ck.keyword_id = ANY(CAST(:named_ids AS int[]))
              AND kp.is_active AND kp.visibility IN ('PUBLIC', 'PRIVATE_ONLY')
              AND """  # noqa: S608 (a constant fragment)
    + keywords_shown("s")
    + """
            ORDER BY c.record_id, ck.confidence DESC NULLS LAST, c.id DESC
        ) AS best
        ORDER BY confidence DESC, record_id
        LIMIT :limit
    )
    SELECT 'lexical' AS kind, record_id, context_id, score FROM lexical
    UNION ALL
    SELECT 'keyword', record_id, context_id, confidence FROM named
    """
)


@dataclass(frozen=True, slots=True)
class ListHit:
    """A record's context in one of the core's lists: ``score`` is BM25 (lexical) or the
    keyword's confidence (keyword, 0 when the judgment recorded none)."""

    record_id: int
    context_id: int
    score: float


@dataclass(frozen=True, slots=True)
class CoreLists:
    lexical: list[ListHit]
    named: list[ListHit]


async def search_lists(
    conn: AsyncConnection,
    *,
    member_id: int,
    terms: Sequence[str],
    named_ids: Sequence[int],
    floor_share: float,
    limit: int,
) -> CoreLists:
    """The lexical list (records whose live contexts share a term with ``terms``, each scoring
    at least ``floor_share`` of the best one) and the name matches (records carrying a
    preset of ``named_ids``), each at most ``limit``, best first."""
    params = {
        "member_id": member_id,
        "terms": list(terms),
        "named_ids": list(named_ids),
        "k1": BM25_K1,
        "b": BM25_B,
        "floor_share": floor_share,
        "limit": limit,
    }
    lists = CoreLists([], [])
    for row in await conn.execute(SEARCH_LISTS, params):
        hit = ListHit(int(row.record_id), int(row.context_id), float(row.score))
        (lists.lexical if row.kind == "lexical" else lists.named).append(hit)
    return lists


# The core's re-check of every context a list found (§7: only the member's live contexts under
# their live records are shown), and what a result shows of each record that passes: its
# place, with the name its owner gave, and the keywords its owner sees (§9, VISIBLE_KEYWORDS),
# all in one snapshot.
SEARCH_RECHECK = text(
    """
    WITH allowed AS (
        SELECT c.id, c.record_id
        FROM core.context AS c
        JOIN core.record AS r ON r.id = c.record_id
        WHERE c.id = ANY(CAST(:context_ids AS bigint[]))
          AND c.member_id = :viewer_id AND r.member_id = :viewer_id
          AND c.deleted_at IS NULL AND r.deleted_at IS NULL
    ),
    shown AS (
        SELECT r.id, p.external_place_id, coalesce(r.place_name, p.name) AS place_name,"""  # noqa: S608 (a constant fragment)
    + VISIBLE_KEYWORDS
    + """
        FROM core.record AS r
        JOIN core.place AS p ON p.id = r.place_id
        WHERE r.id IN (SELECT record_id FROM allowed)
    )
    SELECT allowed.id AS context_id, allowed.record_id, shown.external_place_id,
           shown.place_name, shown.keywords
    FROM allowed JOIN shown ON shown.id = allowed.record_id
    """
)


@dataclass(frozen=True, slots=True)
class ShownRecord:
    """What a search result shows of a record: its place and the owner's keywords."""

    external_place_id: str
    place_name: str
    keywords: tuple[KeywordView, ...]


@dataclass(frozen=True, slots=True)
class Rechecked:
    """``allowed``: the ``(context_id, record_id)`` pairs the member may be shown now;
    ``records``: what each of their records shows, by record id."""

    allowed: set[tuple[int, int]]
    records: dict[int, ShownRecord]


async def recheck(
    conn: AsyncConnection, *, member_id: int, context_ids: Sequence[int]
) -> Rechecked:
    """``SEARCH_RECHECK`` for the contexts the lists found."""
    params = {"viewer_id": member_id, "context_ids": list(context_ids)}
    found = Rechecked(set(), {})
    for row in await conn.execute(SEARCH_RECHECK, params):
        found.allowed.add((int(row.context_id), int(row.record_id)))
        if row.record_id not in found.records:
            found.records[int(row.record_id)] = ShownRecord(
                row.external_place_id,
                row.place_name,
                tuple(
                    KeywordView(k["code"], k["displayName"], k["category"])
                    for k in decode_json_list(row.keywords)
                ),
            )
    return found


# Active presets as search's name matching reads them (docs/search.md "Keyword"): the names
# and examples of the presets a member may see (BLOCKED ones are never shown, §9).
VISIBLE_PRESETS = text(
    """
    SELECT id, display_name, examples FROM ai.keyword_preset
    WHERE is_active AND visibility IN ('PUBLIC', 'PRIVATE_ONLY')
    ORDER BY id
    """
)


async def visible_presets(conn: AsyncConnection) -> list[tuple[int, str, list[str]]]:
    """``(id, display_name, examples)`` of the presets a member may see."""
    rows = await conn.execute(VISIBLE_PRESETS)
    return [(int(r.id), r.display_name, list(r.examples or [])) for r in rows]


# `pinlog-core reindex search`: the next live contexts (their record and member active), in id
# order
# from :after_id, whose terms are missing or of another analyser version.
CONTEXTS_TO_INDEX = text(
    """
    SELECT c.id, c.member_id, c.body
    FROM core.context AS c
    JOIN core.record AS r ON r.id = c.record_id
    JOIN core.member AS m ON m.id = c.member_id
    LEFT JOIN core.context_search_doc AS d ON d.context_id = c.id
    WHERE c.id > :after_id AND c.deleted_at IS NULL AND r.deleted_at IS NULL
      AND m.deleted_at IS NULL
      AND (d.context_id IS NULL OR d.analyser_version <> :analyser_version)
    ORDER BY c.id
    LIMIT :batch
    """
)

# Replace the terms of a batch of contexts, in two statements of one transaction. First the
# contexts still live are share-locked in id order (a delete or an edit of one of them, which
# locks it FOR UPDATE, waits for this batch; one that committed first is seen at the lock and
# the context skipped: no terms are ever written for a non-live context), and each one's
# document row is upserted: its row lock orders every writer of that context's terms (a second
# reindexer waits here until the first commits). Then, for the documents written, in a
# statement whose snapshot is taken after that lock (so it sees what the first one committed),
# the terms no longer produced are deleted and the others upserted. A context's body never
# changes, so terms written for it stay right as long as it is live.
UPSERT_DOCS = text(
    """
    WITH live AS (
        SELECT c.id, c.member_id
        FROM core.context AS c
        JOIN core.record AS r ON r.id = c.record_id
        WHERE c.id = ANY(CAST(:context_ids AS bigint[]))
          AND c.deleted_at IS NULL AND r.deleted_at IS NULL
        ORDER BY c.id
        FOR SHARE OF c
    )
    INSERT INTO core.context_search_doc (context_id, member_id, analyser_version, term_count)
    SELECT live.id, live.member_id, CAST(:analyser_version AS varchar), g.term_count
    FROM unnest(CAST(:context_ids AS bigint[]), CAST(:term_counts AS int[]))
         AS g(context_id, term_count)
    JOIN live ON live.id = g.context_id
    ORDER BY live.id
    ON CONFLICT (context_id) DO UPDATE
    SET analyser_version = EXCLUDED.analyser_version, term_count = EXCLUDED.term_count
    RETURNING context_id
    """
)

REPLACE_TERM_ROWS = text(
    """
    WITH given_terms AS (
        SELECT * FROM unnest(CAST(:term_context_ids AS bigint[]),
                             CAST(:terms AS varchar[]), CAST(:tfs AS int[]))
            AS t(context_id, term, tf)
    ),
    doc AS (
        SELECT context_id, member_id FROM core.context_search_doc
        WHERE context_id = ANY(CAST(:context_ids AS bigint[]))
    ),
    gone AS (
        DELETE FROM core.context_search_term AS t
        USING doc
        WHERE t.context_id = doc.context_id
          AND NOT EXISTS (
              SELECT 1 FROM given_terms AS g
              WHERE g.context_id = t.context_id AND g.term = t.term
          )
    )
    INSERT INTO core.context_search_term (member_id, term, context_id, tf)
    SELECT doc.member_id, g.term, g.context_id, g.tf
    FROM given_terms AS g JOIN doc ON doc.context_id = g.context_id
    ON CONFLICT (member_id, term, context_id) DO UPDATE SET tf = EXCLUDED.tf
    """
)

# `reindex search`'s sweep: of the next :page document rows after :after_id (primary key
# order), those of contexts no longer live (deleted, replaced, on a deleted record or of a
# withdrawn member: never live again) are locked in id order and deleted, their terms by the
# cascade. Each of the page's rows is looked up by key (a correlated subquery, and
# `= ANY(ARRAY(...))`: index scans whatever the tables' sizes). Leftovers come from before the
# purge existed and from the one race a statement's snapshot cannot close
# (PURGED_SEARCH_TERMS). `last_id`: the page's last row, null at the end.
PURGE_STALE = text(
    """
    WITH page AS (
        SELECT context_id FROM core.context_search_doc
        WHERE context_id > :after_id
        ORDER BY context_id
        LIMIT :page
    ),
    stale AS (
        SELECT d.context_id FROM core.context_search_doc AS d
        WHERE d.context_id = ANY(ARRAY(
            SELECT page.context_id FROM page
            WHERE NOT (
                SELECT c.deleted_at IS NULL AND r.deleted_at IS NULL AND m.deleted_at IS NULL
                FROM core.context AS c
                JOIN core.record AS r ON r.id = c.record_id
                JOIN core.member AS m ON m.id = c.member_id
                WHERE c.id = page.context_id
            )
        ))
        ORDER BY d.context_id
        FOR UPDATE
    ),
    purged AS (
        DELETE FROM core.context_search_doc AS d
        WHERE d.context_id = ANY(ARRAY(SELECT context_id FROM stale))
        RETURNING d.context_id
    )
    SELECT (SELECT max(context_id) FROM page) AS last_id,
           (SELECT count(*) FROM purged) AS purged
    """
)


# `status`: live contexts (their record and member active, as status counts them), and those
# whose terms are of :analyser_version.
INDEX_COVERAGE = text(
    """
    SELECT count(*) AS total,
           count(d.context_id) FILTER (WHERE d.analyser_version = :analyser_version) AS indexed
    FROM core.context AS c
    JOIN core.record AS r ON r.id = c.record_id
    JOIN core.member AS m ON m.id = c.member_id
    LEFT JOIN core.context_search_doc AS d ON d.context_id = c.id
    WHERE c.deleted_at IS NULL AND r.deleted_at IS NULL AND m.deleted_at IS NULL
    """
)


@dataclass(frozen=True, slots=True)
class ContextToIndex:
    context_id: int
    member_id: int
    body: str


async def contexts_to_index(
    conn: AsyncConnection, *, after_id: int, analyser_version: str, batch: int
) -> list[ContextToIndex]:
    """``CONTEXTS_TO_INDEX``."""
    params = {"after_id": after_id, "analyser_version": analyser_version, "batch": batch}
    rows = await conn.execute(CONTEXTS_TO_INDEX, params)
    return [ContextToIndex(int(r.id), int(r.member_id), r.body) for r in rows]


async def replace_terms(
    conn: AsyncConnection, *, terms: dict[int, Terms], analyser_version: str
) -> int:
    """``UPSERT_DOCS`` then ``REPLACE_TERM_ROWS`` for ``terms`` (context id -> its terms), in
    the caller's transaction; how many contexts were written (those still live)."""
    ids = sorted(terms)
    term_context_ids, words, tfs = [], [], []
    for context_id in ids:
        for word, tf in zip(terms[context_id].terms, terms[context_id].counts, strict=True):
            term_context_ids.append(context_id)
            words.append(word)
            tfs.append(tf)
    docs = {
        "context_ids": ids,
        "term_counts": [terms[i].length for i in ids],
        "analyser_version": analyser_version,
    }
    written = sorted(int(row.context_id) for row in await conn.execute(UPSERT_DOCS, docs))
    if not written:
        return 0
    params = {
        "context_ids": written,
        "term_context_ids": term_context_ids,
        "terms": words,
        "tfs": tfs,
    }
    await conn.execute(REPLACE_TERM_ROWS, params)
    return len(written)


async def purge_stale(conn: AsyncConnection, *, after_id: int, page: int) -> tuple[int | None, int]:
    """``PURGE_STALE``: ``(the last document id read, None past the last; documents purged)``."""
    row = (await conn.execute(PURGE_STALE, {"after_id": after_id, "page": page})).one()
    return (None if row.last_id is None else int(row.last_id)), int(row.purged)


async def index_coverage(conn: AsyncConnection, *, analyser_version: str) -> tuple[int, int]:
    """``(indexed, total)`` live contexts (``INDEX_COVERAGE``)."""
    row = (await conn.execute(INDEX_COVERAGE, {"analyser_version": analyser_version})).one()
    return int(row.indexed), int(row.total)


# A context that replaces another with the same body (`pinlog-core retry-failed`) gets the
# other's terms, of whatever analyser version (none when it had none: `reindex search` then).
COPY_TERMS = text(
    """
    WITH doc AS (
        INSERT INTO core.context_search_doc (context_id, member_id, analyser_version, term_count)
        SELECT CAST(:new_id AS bigint), member_id, analyser_version, term_count
        FROM core.context_search_doc WHERE context_id = :old_id
        RETURNING context_id, member_id
    )
    INSERT INTO core.context_search_term (member_id, term, context_id, tf)
    SELECT doc.member_id, t.term, doc.context_id, t.tf
    FROM core.context_search_term AS t, doc
    WHERE t.context_id = :old_id AND t.member_id = doc.member_id
    """
)


async def copy_terms(conn: AsyncConnection, *, old_id: int, new_id: int) -> None:
    """``COPY_TERMS``: ``new_id`` (same body, inserted in this transaction) gets the terms of
    ``old_id``."""
    await conn.execute(COPY_TERMS, {"old_id": old_id, "new_id": new_id})
