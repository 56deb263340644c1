"""``ai.context_keyword``: the judged keywords of one context, replaced as a set (§3.3, §4)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

# Remove this context's keyword rows before the new judgment is inserted.
DELETE_KEYWORDS = text("DELETE FROM ai.context_keyword WHERE context_id = :context_id")

# Insert this judgment's keywords in one round trip (zero rows is fine).
INSERT_KEYWORDS = text(
    """
    INSERT INTO ai.context_keyword (context_id, keyword_id, confidence, preset_version)
    SELECT :context_id, selected.keyword_id, selected.confidence, :preset_version
    FROM unnest(CAST(:keyword_ids AS int[]), CAST(:confidences AS numeric[]))
        AS selected(keyword_id, confidence)
    """
)


async def replace(
    conn: AsyncConnection,
    *,
    context_id: int,
    selections: Sequence[tuple[int, float]],
    preset_version: int,
) -> int:
    """Delete-then-insert ``(keyword_id, confidence 0..1)`` pairs; returns rows inserted."""
    await conn.execute(DELETE_KEYWORDS, {"context_id": context_id})
    if not selections:
        return 0
    result = await conn.execute(
        INSERT_KEYWORDS,
        {
            "context_id": context_id,
            "keyword_ids": [keyword_id for keyword_id, _ in selections],
            "confidences": [round(confidence, 3) for _, confidence in selections],
            "preset_version": preset_version,
        },
    )
    return result.rowcount
