"""The owner's list of records reads a page from its key through the index on
``(member_id, created_at DESC, id DESC)`` of active records: no sort, no scan of the member's
older records (0040_core_record_list_order.sql)."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import text

from core_service.repository.record_page import LIST_MEMBER_RECORDS


async def test_a_page_is_an_index_range_in_list_order(engine):
    params = {
        "viewer_id": 1,
        "after_created_at": datetime(2026, 1, 1, tzinfo=UTC),
        "after_id": 5,
        "limit": 21,
        "keyword_id": None,  # the plain list (browse by keyword adds a per-record check)
    }
    async with engine.begin() as conn:
        # Tiny test tables: make the planner show what the index can do (a range in list
        # order) rather than what is cheapest for a handful of rows.
        for setting in ("enable_seqscan", "enable_bitmapscan", "enable_sort"):
            await conn.execute(text(f"SET LOCAL {setting} = off"))
        plan = "\n".join(
            row[0]
            for row in await conn.execute(text(f"EXPLAIN {LIST_MEMBER_RECORDS.text}"), params)
        )
    lines = [line.strip() for line in plan.splitlines()]
    limit = next(i for i, line in enumerate(lines) if line.startswith("->  Limit"))
    assert lines[limit + 1].startswith(
        "->  Index Scan using record_member_active_created_idx on record r"
    )
    assert "ROW(created_at, id) < ROW(" in lines[limit + 2]  # the key is an index condition
