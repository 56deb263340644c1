"""A member's own active records, one page at a time, newest first (keyset pagination).

The key is ``(created_at, id)``: neither ever changes, so a traversal lists each record that
exists throughout it exactly once, whatever is created, edited or deleted meanwhile (records
created during the traversal, being newer than the first page, may be missed). One statement
per page whatever its size: the page's records with their place, live-context count, the
owner's keyword view (``record_view.VISIBLE_KEYWORDS``) and AI-state counts.

The AI state of one live context (the shape of the record read's per-context ``ai``):
``failed`` if any stage is ``FAILED``, ``completed`` if every stage is ``COMPLETED``, ``processing``
if any is ``PROCESSING``, else ``pending`` (also when the state row is not there yet).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from core_service.repository.record_view import (
    VISIBLE_KEYWORDS,
    VISIBLE_KEYWORDS_LITERALS,
    KeywordView,
    decode_json_list,
)
from pinlog_platform.contract.keyword_reads import keywords_shown
from pinlog_platform.contract.states import STAGE_ORDER, Status

AI_STATES = ("pending", "processing", "completed", "failed")

# The quoted words of LIST_MEMBER_RECORDS that are not statuses (tests/platform/
# test_stage_vocabulary.py holds every other quoted word to the status vocabulary).
NON_STATUS_LITERALS = VISIBLE_KEYWORDS_LITERALS | set(AI_STATES)

# The state row ``s``'s stage statuses in stage order, then the AI state of its context (module
# docstring; ``record_reads.summarize`` for one context), built from the stage order at import.
_STAGE_STATUSES = ", ".join(f"s.{stage.status_column}" for stage in STAGE_ORDER)
_EVERY_STAGE_COMPLETED = " AND ".join(
    f"s.{stage.status_column} = '{Status.COMPLETED}'" for stage in STAGE_ORDER
)
RECORD_STATE = (
    f"CASE WHEN '{Status.FAILED}' IN ({_STAGE_STATUSES}) THEN 'failed'"
    f" WHEN {_EVERY_STAGE_COMPLETED} THEN 'completed'"
    f" WHEN '{Status.PROCESSING}' IN ({_STAGE_STATUSES}) THEN 'processing'"
    " ELSE 'pending' END"
)

# One page of the member's active records strictly after the key (:after_created_at,
# :after_id) in newest-first order (no key: from the newest), with per-record aggregates.
# :keyword_id (browse by keyword, docs/core-service.md): only records with a live context whose
# keywords the owner sees (§9, keywords_shown) include that preset; NULL: every record.
LIST_MEMBER_RECORDS = text(
    """
    WITH page AS (
        SELECT r.id, r.member_id, r.public_id, r.place_id, r.place_name, r.created_at
        FROM core.record AS r
        WHERE r.member_id = :viewer_id AND r.deleted_at IS NULL
          AND (CAST(:after_created_at AS timestamptz) IS NULL
               OR (r.created_at, r.id)
                  < (CAST(:after_created_at AS timestamptz), CAST(:after_id AS bigint)))
          AND (CAST(:keyword_id AS int) IS NULL OR EXISTS (
              SELECT 1
              FROM core.context AS kc
              JOIN ai.context_ai_state AS ks ON ks.context_id = kc.id
              JOIN ai.context_keyword AS ck ON ck.context_id = kc.id
              WHERE kc.record_id = r.id AND kc.deleted_at IS NULL
                AND ck.keyword_id = CAST(:keyword_id AS int)
                AND """
    + keywords_shown("ks")
    + """
          ))
        ORDER BY r.created_at DESC, r.id DESC
        LIMIT :limit
    )
    SELECT r.id AS record_id, r.public_id, r.created_at, p.external_place_id,
           coalesce(r.place_name, p.name) AS place_name,
           ai.context_count, ai.pending, ai.processing, ai.completed, ai.failed,"""
    + VISIBLE_KEYWORDS
    + """
    FROM page AS r
    JOIN core.place AS p ON p.id = r.place_id
    CROSS JOIN LATERAL (
        SELECT count(*) AS context_count,
               count(*) FILTER (WHERE x.state = 'pending') AS pending,
               count(*) FILTER (WHERE x.state = 'processing') AS processing,
               count(*) FILTER (WHERE x.state = 'completed') AS completed,
               count(*) FILTER (WHERE x.state = 'failed') AS failed
        FROM (
            SELECT """
    + RECORD_STATE
    + """ AS state
            FROM core.context AS c
            LEFT JOIN ai.context_ai_state AS s ON s.context_id = c.id
            WHERE c.record_id = r.id AND c.deleted_at IS NULL
        ) AS x
    ) AS ai
    ORDER BY r.created_at DESC, r.id DESC
    """
)


@dataclass(frozen=True, slots=True)
class RecordSummary:
    """One list item: ``ai_counts`` maps each of ``AI_STATES`` to its number of live contexts."""

    record_id: int
    public_id: str
    created_at: datetime
    external_place_id: str
    place_name: str
    context_count: int
    keywords: tuple[KeywordView, ...]
    ai_counts: dict[str, int]


async def list_page(
    conn: AsyncConnection,
    *,
    member_id: int,
    after: tuple[datetime, int] | None,
    limit: int,
    keyword_id: int | None = None,
) -> list[RecordSummary]:
    """Up to ``limit`` of the member's active records after the key ``after``, newest first;
    with ``keyword_id``, only those carrying that keyword in the owner's view."""
    after_created_at, after_id = after if after is not None else (None, None)
    params = {
        "viewer_id": member_id,
        "after_created_at": after_created_at,
        "after_id": after_id,
        "limit": limit,
        "keyword_id": keyword_id,
    }
    return [
        RecordSummary(
            record_id=row.record_id,
            public_id=row.public_id,
            created_at=row.created_at,
            external_place_id=row.external_place_id,
            place_name=row.place_name,
            context_count=row.context_count,
            keywords=tuple(
                KeywordView(item["code"], item["displayName"], item["category"])
                for item in decode_json_list(row.keywords)
            ),
            ai_counts={state: getattr(row, state) for state in AI_STATES},
        )
        for row in await conn.execute(LIST_MEMBER_RECORDS, params)
    ]


# A keyword a member may browse by: an active preset that is not BLOCKED (§9).
BROWSABLE_KEYWORD = text(
    """
    SELECT id FROM ai.keyword_preset
    WHERE code = :code AND is_active AND visibility IN ('PUBLIC', 'PRIVATE_ONLY')
    """
)


async def browsable_keyword(conn: AsyncConnection, code: str) -> int | None:
    """The id of the preset ``code`` when a member may browse by it, else ``None``."""
    return (await conn.execute(BROWSABLE_KEYWORD, {"code": code})).scalar_one_or_none()
