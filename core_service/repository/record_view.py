"""Reading records as a member sees them: active contexts and aggregated keywords (§9).

One statement for any number of records, which also checks that the viewer is an active
member. Keyword rules are whitelists in SQL: the context is
active, its keywords may be shown (``keyword_status = 'COMPLETED'``, or its previous judgment
while a preset reclassification re-judges it: ``pinlog_platform.contract.keyword_reads``, the §9
Deviation), the preset is active, and its visibility is ``PUBLIC``, or ``PRIVATE_ONLY`` when
the viewer owns the record. One statement sees one snapshot: a context being re-judged shows
its previous keywords or its new ones, never none. Bodies and each context's AI
state (statuses and failure reasons) are read only for the owner. Empty lists are
``[]``, never ``null``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
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
    "contextId",
    "createdAt",
    *(column for stage in STAGE_ORDER for column in (stage.status_column, stage.failure_column)),
}

# The keywords of record ``r`` that ``:viewer_id`` may see (§9 "Keyword read rules" and its
# Deviation), best first, as a JSON array; one fragment for the record read and the owner's list
# of records.
VISIBLE_KEYWORDS = (
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
                      OR (kp.visibility = 'PRIVATE_ONLY' AND r.member_id = :viewer_id))
               GROUP BY kp.code, kp.display_name, kp.category
           ) AS k
       ), '[]') AS keywords
"""
)

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

LOAD_RECORD_VIEWS = text(
    """
    SELECT viewer.active AS viewer_active,
           r.id AS record_id, r.member_id, p.external_place_id,
           coalesce(r.place_name, p.name) AS place_name,
           coalesce((
               SELECT json_agg(json_build_object(
                          'contextId', c.id,
                          'body', CASE WHEN r.member_id = :viewer_id THEN c.body END,
                          'createdAt', c.created_at,
                          'ai', CASE WHEN r.member_id = :viewer_id THEN (
                              SELECT """
    + _STAGE_COLUMNS_AS_JSON
    + """
                              FROM ai.context_ai_state AS s WHERE s.context_id = c.id) END)
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
    LEFT JOIN (core.record AS r JOIN core.place AS p ON p.id = r.place_id)
        ON viewer.active
       AND r.id = ANY(CAST(:record_ids AS bigint[])) AND r.deleted_at IS NULL
    ORDER BY r.id
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
    body: str | None  # None unless the viewer owns the record
    created_at: datetime
    # None unless the viewer owns the record (or the context has no state row)
    ai: AiStatuses | None = None


@dataclass(frozen=True, slots=True)
class KeywordView:
    code: str
    display_name: str
    category: str


@dataclass(frozen=True, slots=True)
class RecordView:
    record_id: int
    member_id: int
    external_place_id: str
    place_name: str
    contexts: tuple[ContextView, ...]
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


async def load(
    conn: AsyncConnection, *, viewer_id: int, record_ids: Sequence[int]
) -> list[RecordView] | None:
    """The active records among ``record_ids`` as ``viewer_id`` may see them, by id; ``None``
    when the viewer is not an active member (the statement checks it: the route verifies
    only the token)."""
    params = {"viewer_id": viewer_id, "record_ids": list(record_ids)}
    views = []
    for row in await conn.execute(LOAD_RECORD_VIEWS, params):
        if not row.viewer_active:
            return None
        if row.record_id is None:  # an active viewer, none of the records
            continue
        contexts = tuple(
            ContextView(
                context_id=int(item["contextId"]),
                body=item["body"],
                created_at=datetime.fromisoformat(item["createdAt"]),
                ai=_statuses(item["ai"]),
            )
            for item in decode_json_list(row.contexts)
        )
        keywords = tuple(
            KeywordView(item["code"], item["displayName"], item["category"])
            for item in decode_json_list(row.keywords)
        )
        views.append(
            RecordView(
                record_id=row.record_id,
                member_id=row.member_id,
                external_place_id=row.external_place_id,
                place_name=row.place_name,
                contexts=contexts,
                keywords=keywords,
            )
        )
    return views
