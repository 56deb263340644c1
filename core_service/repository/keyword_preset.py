"""The core's read of the keyword vocabulary (``ai.keyword_preset``, written by the worker's
``presets load``; the core may only read it: 0023)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

# Every preset a member may see or browse by (§9: active, not BLOCKED), in the preset list's
# order, after the caller's activity (one row with NULL preset columns: an active caller and
# no presets).
KEYWORD_VOCABULARY = text(
    """
    SELECT viewer.active AS viewer_active,
           kp.code, kp.display_name, kp.category, kp.visibility
    FROM (
        SELECT EXISTS (
            SELECT 1 FROM core.member WHERE id = :viewer_id AND deleted_at IS NULL
        ) AS active
    ) AS viewer
    LEFT JOIN ai.keyword_preset AS kp
        ON viewer.active AND kp.is_active AND kp.visibility IN ('PUBLIC', 'PRIVATE_ONLY')
    ORDER BY kp.id
    """
)


@dataclass(frozen=True, slots=True)
class VocabularyKeyword:
    code: str
    display_name: str
    category: str
    visibility: str


async def vocabulary(conn: AsyncConnection, *, viewer_id: int) -> list[VocabularyKeyword] | None:
    """Every active, non-``BLOCKED`` preset; ``None`` when the viewer is not an active member
    (the statement checks it)."""
    rows = (await conn.execute(KEYWORD_VOCABULARY, {"viewer_id": viewer_id})).all()
    if not rows or not rows[0].viewer_active:
        return None
    return [
        VocabularyKeyword(row.code, row.display_name, row.category, row.visibility)
        for row in rows
        if row.code is not None
    ]
