"""The member's own records, page by page (``GET /api/v1/records``): keyset pagination over
``(created_at, id)`` newest first (``repository/record_page.py``), an opaque cursor, and each
record's AI state aggregated over its live contexts.

A record's ``ai.state``: ``failed`` if any live context failed, else ``processing``, else
``pending``, else ``completed`` (every live context completed).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.errors import InvalidCursorError, InvalidKeywordError
from core_service.repository import record_page
from core_service.repository.db import autocommit
from core_service.repository.record_page import RecordSummary

BIGINT_MAX = 2**63 - 1
# A record's state is the first of these that any of its live contexts is in.
STATE_PRECEDENCE = ("failed", "processing", "pending")


@dataclass(frozen=True, slots=True)
class ListedRecord:
    """A record of the page and its AI state (``record_ai_state`` of its counts)."""

    summary: RecordSummary
    ai_state: str


@dataclass(frozen=True, slots=True)
class RecordPage:
    """``next_cursor`` is ``None`` on the last page."""

    records: list[ListedRecord]
    next_cursor: str | None


def record_ai_state(counts: dict[str, int]) -> str:
    """The record's AI state from its live contexts' counts per state (module docstring)."""
    return next((state for state in STATE_PRECEDENCE if counts.get(state)), "completed")


def encode_cursor(created_at: datetime, record_id: int, keyword: str | None = None) -> str:
    """The position just after a record, as URL-safe text with no padding; a page browsed by
    ``keyword`` binds its cursor to that keyword."""
    text = f"{created_at.isoformat()}/{record_id}" + ("" if keyword is None else f"/{keyword}")
    return base64.urlsafe_b64encode(text.encode("ascii")).decode("ascii").rstrip("=")


def decode_cursor(cursor: str, keyword: str | None = None) -> tuple[datetime, int]:
    """``(created_at, record_id)`` of a cursor from ``encode_cursor`` with the same
    ``keyword``; ``InvalidCursorError`` (422) for anything else (a cursor of another keyword,
    or of the plain list, included)."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        raw = base64.urlsafe_b64decode(padded.encode("ascii")).decode("ascii")
        stamp, record_id_text, *bound = raw.split("/")
        created_at = datetime.fromisoformat(stamp)
        record_id = int(record_id_text)
    except (ValueError, UnicodeError, binascii.Error):
        raise InvalidCursorError("malformed cursor") from None
    if created_at.tzinfo is None or not 0 < record_id <= BIGINT_MAX or len(bound) > 1:
        raise InvalidCursorError("malformed cursor")
    if (bound[0] if bound else None) != keyword:
        raise InvalidCursorError("cursor belongs to another listing")
    return created_at, record_id


class RecordPages:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def page(
        self, *, member_id: int, limit: int, cursor: str | None, keyword: str | None = None
    ) -> RecordPage:
        """Up to ``limit`` of the member's active records after ``cursor`` (from the newest
        when ``None``), newest first, in one query; with ``keyword`` (a preset code), only
        records carrying it in the owner's view (one more query, resolving the code). Raises
        ``InvalidCursorError`` (422: malformed, or issued for another keyword or for the plain
        list), ``InvalidKeywordError`` (422: unknown, inactive or ``BLOCKED`` code)."""
        after = None if cursor is None else decode_cursor(cursor, keyword)
        async with autocommit(self._engine) as conn:
            keyword_id = None
            if keyword is not None:
                keyword_id = await record_page.browsable_keyword(conn, keyword)
                if keyword_id is None:
                    raise InvalidKeywordError("keyword is unknown, inactive or blocked")
            # One more than asked: whether a next page exists, without a second query.
            found = await record_page.list_page(
                conn, member_id=member_id, after=after, limit=limit + 1, keyword_id=keyword_id
            )
        records = found[:limit]
        more = len(found) > limit
        last = records[-1] if records else None
        next_cursor = (
            encode_cursor(last.created_at, last.record_id, keyword) if more and last else None
        )
        listed = [ListedRecord(r, record_ai_state(r.ai_counts)) for r in records]
        return RecordPage(records=listed, next_cursor=next_cursor)
