"""``ai.context_keyword_analysis``: unmatched concepts of the last judgment (§4).

Analysis data, never shown to users; written even when the list is empty.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

# Insert or replace this context's analysis row.
UPSERT_ANALYSIS = text(
    """
    INSERT INTO ai.context_keyword_analysis
        (context_id, preset_version, unmatched_concepts, model_profile, updated_at)
    VALUES (:context_id, :preset_version, CAST(:unmatched_concepts AS jsonb), :model_profile, now())
    ON CONFLICT (context_id) DO UPDATE SET
        preset_version = EXCLUDED.preset_version,
        unmatched_concepts = EXCLUDED.unmatched_concepts,
        model_profile = EXCLUDED.model_profile,
        updated_at = now()
    """
)


async def upsert(
    conn: AsyncConnection,
    *,
    context_id: int,
    preset_version: int,
    unmatched_concepts: Sequence[str],
    model_profile: str,
) -> None:
    """Store the judgment's ``unmatchedConcepts`` and which judge (``model_profile``) decided."""
    await conn.execute(
        UPSERT_ANALYSIS,
        {
            "context_id": context_id,
            "preset_version": preset_version,
            "unmatched_concepts": json.dumps(list(unmatched_concepts), ensure_ascii=False),
            "model_profile": model_profile,
        },
    )
