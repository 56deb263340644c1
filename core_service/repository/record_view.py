"""Reading records: the owner's view by record id, every member's public view by public id
(§9 and its Deviation "another member's view by public id").

One statement per read, which also checks that the viewer is an active member. A record id
names only the caller's own record: another member's record reads exactly as a missing one.
Keyword rules are whitelists in SQL: the context is active, its keywords may be shown
(``keyword_status = 'COMPLETED'``, or its previous judgment while a preset reclassification
re-judges it: ``pinlog_platform.contract.keyword_reads``, the §9 Deviation), the preset is
active, and its visibility is ``PUBLIC``, or ``PRIVATE_ONLY`` in the owner's view. One
statement sees one snapshot: a context being re-judged shows its previous keywords or its new
ones, never none. Bodies, context ids and each context's AI state (statuses and failure
reasons) are in the owner's view only. Empty lists are ``[]``, never ``null``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from pinlog_platform.contract.keyword_reads import keywords_shown
from pinlog_platform.contract.states import STAGE_ORDER, Stage, Status

# The quoted words of VISIBLE_KEYWORDS that are not statuses (visibilities, JSON keys), and of
# this module's statements: tests/platform/test_stage_vocabulary.py holds every other quoted word
# to the status vocabulary, so a misspelt status still fails there.
VISIBLE_KEYWORDS_LITERALS = frozenset(
    {"PUBLIC", "PRIVATE_ONLY", "[]", "code", "displayName", "category"}
)
NON_STATUS_LITERALS = VISIBLE_KEYWORDS_LITERALS | {
    "ai",
    "body",
    "confidence",
    "contextId",
    "createdAt",
    "keywords",
    *(column for stage in STAGE_ORDER for column in (stage.status_column, stage.failure_column)),
}


def _visible_keywords(private_shown: str) -> str:
    """The keywords of record ``r`` a viewer may see (§9 "Keyword read rules" and its
    Deviation), best first, as a JSON array: ``PUBLIC`` ones, and ``PRIVATE_ONLY`` ones where
    the SQL condition ``private_shown`` holds."""
    return (
        """
       coalesce((
           SELECT json_agg(json_build_object(
                      'code', k.code, 'displayName', k.display_name, 'category', k.category)
                  ORDER BY k.best DESC, k.code)
           FROM (
               SELECT kp.code, kp.display_name, kp.category, max(ck.confidence) AS best
               FROM core.context AS c
               JOIN ai.context_ai_state AS s ON s.context_id = c.id
               JOIN ai.context_keyword AS ck ON ck.context_id = c.id
               JOIN ai.keyword_preset AS kp ON kp.id = ck.keyword_id
               WHERE c.record_id = r.id AND c.deleted_at IS NULL
                 AND """
        + keywords_shown("s")
        + """
                 AND kp.is_active
                 AND (kp.visibility = 'PUBLIC'
                      OR (kp.visibility = 'PRIVATE_ONLY' AND """
        + private_shown
        + """))
               GROUP BY kp.code, kp.display_name, kp.category
           ) AS k
       ), '[]') AS keywords
"""
    )


# The keywords of record ``r`` that ``:viewer_id`` may see: one fragment for the owner's reads
# (the record read, the list of records, search results, the export).
VISIBLE_KEYWORDS = _visible_keywords("r.member_id = :viewer_id")
# The keywords of record ``r`` that every member sees (its public view): ``PUBLIC`` only.
PUBLIC_KEYWORDS = _visible_keywords("false")

# The state row ``s``'s status and failure columns of every stage, as one JSON object keyed by
# column name (``_statuses`` reads it back by stage), built from the stage order at import.
_STAGE_COLUMNS_AS_JSON = (
    "json_build_object("
    + ", ".join(
        f"'{column}', s.{column}"
        for stage in STAGE_ORDER
        for column in (stage.status_column, stage.failure_column)
    )
    + ")"
)

# A live context `c` as its owner reads it: id, body, time and AI statuses (JSON fields).
_OWNER_CONTEXT_FIELDS = (
    """
                          'contextId', c.id,
                          'body', c.body,
                          'createdAt', c.created_at,
                          'ai', (
                              SELECT """
    + _STAGE_COLUMNS_AS_JSON
    + """
                              FROM ai.context_ai_state AS s WHERE s.context_id = c.id)"""
)

# Whether the caller :viewer_id is an active member (one row either way), joined to an active
# record that the reading statement's own condition, continued after this, names.
_ACTIVE_VIEWER_AND_RECORD = """
    FROM (
        SELECT EXISTS (
            SELECT 1 FROM core.member WHERE id = :viewer_id AND deleted_at IS NULL
        ) AS active
    ) AS viewer
    LEFT JOIN (core.record AS r JOIN core.place AS p ON p.id = r.place_id)
        ON viewer.active"""

# The caller's own active record :record_id with its live contexts (bodies and AI states) and
# the owner's keywords, after the caller's activity. A record of another member reads exactly
# as a missing one (one row, record columns NULL): the same statement, the same answer.
LOAD_OWN_RECORD = text(
    """
    SELECT viewer.active AS viewer_active,
           r.id AS record_id, r.member_id, r.public_id, p.external_place_id,
           coalesce(r.place_name, p.name) AS place_name,
           coalesce((
               SELECT json_agg(json_build_object("""
    + _OWNER_CONTEXT_FIELDS
    + """)
                      ORDER BY c.created_at, c.id)
               FROM core.context AS c
               WHERE c.record_id = r.id AND c.deleted_at IS NULL
           ), '[]') AS contexts,"""
    + VISIBLE_KEYWORDS
    + _ACTIVE_VIEWER_AND_RECORD
    + """
       AND r.id = :record_id AND r.member_id = :viewer_id AND r.deleted_at IS NULL
    """
)

# The public view of the active record :public_id, whoever owns it (the owner included): the
# place, each live context's time, PUBLIC keywords; no ids, bodies or AI states. After the
# caller's activity.
LOAD_PUBLIC_RECORD = text(
    """
    SELECT viewer.active AS viewer_active,
           r.public_id, p.external_place_id, coalesce(r.place_name, p.name) AS place_name,
           coalesce((
               SELECT json_agg(json_build_object('createdAt', c.created_at)
                               ORDER BY c.created_at, c.id)
               FROM core.context AS c
               WHERE c.record_id = r.id AND c.deleted_at IS NULL
           ), '[]') AS contexts,"""
    + PUBLIC_KEYWORDS
    + _ACTIVE_VIEWER_AND_RECORD
    + """ AND r.public_id = :public_id AND r.deleted_at IS NULL
    """
)


@dataclass(frozen=True, slots=True)
class AiStatuses:
    """A context's ``ai.context_ai_state`` as stored: each stage's status and failure reason
    code (``None`` unless failed), by stage."""

    statuses: Mapping[Stage, Status]
    failures: Mapping[Stage, str | None]

    def status(self, stage: Stage) -> Status:
        return self.statuses[stage]

    def failure(self, stage: Stage) -> str | None:
        return self.failures[stage]


@dataclass(frozen=True, slots=True)
class ContextView:
    context_id: int
    body: str
    created_at: datetime
    ai: AiStatuses | None = None  # None: the context has no state row


@dataclass(frozen=True, slots=True)
class KeywordView:
    code: str
    display_name: str
    category: str


@dataclass(frozen=True, slots=True)
class RecordView:
    """The owner's view of a record."""

    record_id: int
    member_id: int
    public_id: str
    external_place_id: str
    place_name: str
    contexts: tuple[ContextView, ...]
    keywords: tuple[KeywordView, ...]


@dataclass(frozen=True, slots=True)
class PublicRecordView:
    """A record as every member sees it: ``context_times`` is each live context's
    ``created_at``, oldest first; ``PUBLIC`` keywords only."""

    public_id: str
    external_place_id: str
    place_name: str
    context_times: tuple[datetime, ...]
    keywords: tuple[KeywordView, ...]


def decode_json_list(value: object) -> list[dict]:
    # asyncpg returns json as text unless a codec is registered.
    return json.loads(value) if isinstance(value, str) else list(value or [])


def _statuses(item: dict | None) -> AiStatuses | None:
    if item is None:
        return None
    return AiStatuses(
        statuses=MappingProxyType({s: Status(item[s.status_column]) for s in STAGE_ORDER}),
        failures=MappingProxyType({s: item[s.failure_column] for s in STAGE_ORDER}),
    )


def _keywords(value: object) -> tuple[KeywordView, ...]:
    return tuple(
        KeywordView(item["code"], item["displayName"], item["category"])
        for item in decode_json_list(value)
    )


class ViewerInactive(Exception):
    """The viewer is not an active member (the statement checked it)."""


async def load_own(conn: AsyncConnection, *, viewer_id: int, record_id: int) -> RecordView | None:
    """``viewer_id``'s own active record ``record_id``; ``None`` when it is missing, deleted or
    another member's (one answer for all three). Raises ``ViewerInactive`` when the viewer is
    not an active member (the route verifies only the token)."""
    params = {"viewer_id": viewer_id, "record_id": record_id}
    row = (await conn.execute(LOAD_OWN_RECORD, params)).one()
    if not row.viewer_active:
        raise ViewerInactive
    if row.record_id is None:
        return None
    contexts = tuple(
        ContextView(
            context_id=int(item["contextId"]),
            body=item["body"],
            created_at=datetime.fromisoformat(item["createdAt"]),
            ai=_statuses(item["ai"]),
        )
        for item in decode_json_list(row.contexts)
    )
    return RecordView(
        record_id=row.record_id,
        member_id=row.member_id,
        public_id=row.public_id,
        external_place_id=row.external_place_id,
        place_name=row.place_name,
        contexts=contexts,
        keywords=_keywords(row.keywords),
    )


async def load_public(
    conn: AsyncConnection, *, viewer_id: int, public_id: str
) -> PublicRecordView | None:
    """The public view of the active record ``public_id``; ``None`` when there is none.
    Raises ``ViewerInactive`` when the viewer is not an active member."""
    params = {"viewer_id": viewer_id, "public_id": public_id}
    row = (await conn.execute(LOAD_PUBLIC_RECORD, params)).one()
    if not row.viewer_active:
        raise ViewerInactive
    if row.public_id is None:
        return None
    return PublicRecordView(
        public_id=row.public_id,
        external_place_id=row.external_place_id,
        place_name=row.place_name,
        context_times=tuple(
            datetime.fromisoformat(item["createdAt"]) for item in decode_json_list(row.contexts)
        ),
        keywords=_keywords(row.keywords),
    )


# One page of the member's own export (GET /api/v1/members/me/export): its active records
# strictly after the key (:after_created_at, :after_id) in the list's order (newest first, the
# index of record_page), each with its live contexts (bodies, AI statuses, and the keywords the
# owner sees on each: §9's owner rule) and the record's keywords, after the caller's activity;
# `exported_at` is the transaction's time (the export reads one REPEATABLE READ snapshot).
EXPORT_PAGE = text(
    """
    SELECT viewer.active AS viewer_active, now() AS exported_at,
           r.id AS record_id, r.public_id, r.created_at, p.external_place_id,
           coalesce(r.place_name, p.name) AS place_name,
           coalesce((
               SELECT json_agg(json_build_object("""
    + _OWNER_CONTEXT_FIELDS
    + """,
                          'keywords', coalesce((
                              SELECT json_agg(json_build_object(
                                         'code', kp.code, 'displayName', kp.display_name,
                                         'category', kp.category, 'confidence', ck.confidence)
                                     ORDER BY ck.confidence DESC, kp.code)
                              FROM ai.context_ai_state AS s
                              JOIN ai.context_keyword AS ck ON ck.context_id = s.context_id
                              JOIN ai.keyword_preset AS kp ON kp.id = ck.keyword_id
                              WHERE s.context_id = c.id AND """
    + keywords_shown("s")
    + """
                                AND kp.is_active
                                AND kp.visibility IN ('PUBLIC', 'PRIVATE_ONLY')
                          ), '[]'))
                      ORDER BY c.created_at, c.id)
               FROM core.context AS c
               WHERE c.record_id = r.id AND c.deleted_at IS NULL
           ), '[]') AS contexts,"""
    + VISIBLE_KEYWORDS
    + """
    FROM (
        SELECT EXISTS (
            SELECT 1 FROM core.member WHERE id = :viewer_id AND deleted_at IS NULL
        ) AS active
    ) AS viewer
    LEFT JOIN LATERAL (
        SELECT page.id, page.member_id, page.public_id, page.place_id, page.place_name,
               page.created_at
        FROM core.record AS page
        WHERE viewer.active AND page.member_id = :viewer_id AND page.deleted_at IS NULL
          AND (CAST(:after_created_at AS timestamptz) IS NULL
               OR (page.created_at, page.id)
                  < (CAST(:after_created_at AS timestamptz), CAST(:after_id AS bigint)))
        ORDER BY page.created_at DESC, page.id DESC
        LIMIT :limit
    ) AS r ON true
    LEFT JOIN core.place AS p ON p.id = r.place_id
    ORDER BY r.created_at DESC, r.id DESC
    """
)


@dataclass(frozen=True, slots=True)
class ExportedContext:
    context_id: int
    body: str
    created_at: datetime
    ai: AiStatuses | None
    keywords: tuple[tuple[KeywordView, float | None], ...]  # with each one's confidence


@dataclass(frozen=True, slots=True)
class ExportedRecord:
    record_id: int
    public_id: str
    created_at: datetime
    external_place_id: str
    place_name: str
    contexts: tuple[ExportedContext, ...]
    keywords: tuple[KeywordView, ...]


@dataclass(frozen=True, slots=True)
class ExportPage:
    """``exported_at``: the snapshot's time; ``records``: up to the page's limit, newest
    first."""

    exported_at: datetime
    records: list[ExportedRecord]


async def export_page(
    conn: AsyncConnection,
    *,
    viewer_id: int,
    after: tuple[datetime, int] | None,
    limit: int,
) -> ExportPage:
    """``EXPORT_PAGE``: up to ``limit`` of the viewer's active records after the key
    ``after``. Raises ``ViewerInactive`` when the viewer is not an active member."""
    after_created_at, after_id = after if after is not None else (None, None)
    params = {
        "viewer_id": viewer_id,
        "after_created_at": after_created_at,
        "after_id": after_id,
        "limit": limit,
    }
    rows = (await conn.execute(EXPORT_PAGE, params)).all()
    if not rows[0].viewer_active:
        raise ViewerInactive
    records = [
        ExportedRecord(
            record_id=row.record_id,
            public_id=row.public_id,
            created_at=row.created_at,
            external_place_id=row.external_place_id,
            place_name=row.place_name,
            contexts=tuple(
                ExportedContext(
                    context_id=int(item["contextId"]),
                    body=item["body"],
                    created_at=datetime.fromisoformat(item["createdAt"]),
                    ai=_statuses(item["ai"]),
                    keywords=tuple(
                        (
                            KeywordView(k["code"], k["displayName"], k["category"]),
                            None if k["confidence"] is None else float(k["confidence"]),
                        )
                        for k in item["keywords"]
                    ),
                )
                for item in decode_json_list(row.contexts)
            ),
            keywords=_keywords(row.keywords),
        )
        for row in rows
        if row.record_id is not None
    ]
    return ExportPage(rows[0].exported_at, records)
