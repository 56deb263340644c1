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
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.errors import InvalidCursorError, InvalidKeywordError
from core_service.repository import record_page
from core_service.repository.db import client_autocommit
from core_service.repository.record_page import RecordSummary
from pinlog_platform.contract.canonical_ids import parse_canonical_id

# The times a cursor may carry (UTC): every record's created_at is a now() of the database.
CURSOR_TIMES = (datetime(1970, 1, 1, tzinfo=UTC), datetime(9999, 1, 1, tzinfo=UTC))
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
    ``keyword``; ``InvalidCursorError`` (422) for anything else: the cursor must be exactly
    what ``encode_cursor`` writes for its values (so ``1_0``, `` 1``, ``+1`` or ``01`` never
    pass as an id: ``parse_canonical_id``), the time zone-aware and, in UTC, within
    ``CURSOR_TIMES`` (every ``created_at`` the core writes; PostgreSQL is never handed a time
    it cannot hold), and issued for the same listing (a cursor of another keyword, or of the
    plain list, is refused)."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        raw = base64.urlsafe_b64decode(padded.encode("ascii")).decode("ascii")
        stamp, record_id_text, *bound = raw.split("/")
        created_at = datetime.fromisoformat(stamp)
        in_utc = created_at.astimezone(UTC) if created_at.tzinfo is not None else None
    except (ValueError, UnicodeError, binascii.Error, OverflowError):
        raise InvalidCursorError("malformed cursor") from None
    record_id = parse_canonical_id(record_id_text)
    bound_keyword = bound[0] if len(bound) == 1 else None
    if (
        in_utc is None
        or record_id is None
        or len(bound) > 1
        or not CURSOR_TIMES[0] <= in_utc <= CURSOR_TIMES[1]
        or encode_cursor(created_at, record_id, bound_keyword) != cursor
    ):
        raise InvalidCursorError("malformed cursor")
    if bound_keyword != keyword:
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
        async with client_autocommit(self._engine) as conn:
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
