"""``ai.context_embedding``: personal search over the stored vectors (§7).

Vectors are written only by the embedding save (``stage_saves.SAVE_EMBEDDING``), whose conflict
branch never touches ``is_deleted`` (§0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from pinlog_platform.contract.keyword_reads import keywords_shown
from pinlog_platform.contract.search import clamp_similarity


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One record's best context for a query; ``similarity`` is cosine clamped to -1..1;
    ``keyword_matched``: the record has a keyword its owner sees (§9) whose preset vector's
    cosine to the query is above the threshold (§7)."""

    record_id: int
    context_id: int
    similarity: float
    keyword_matched: bool = False


# The quoted words of SEARCH_SIMILAR that are not statuses (tests/platform/test_stage_vocabulary.py
# holds every other quoted word to the status vocabulary).
NON_STATUS_LITERALS = frozenset({"NaN", "PUBLIC", "PRIVATE_ONLY"})

# Exact cosine over one user's live, completed vectors of one profile; the best context per
# record; the limit applied after de-duplication (§7). NaN (a zero vector) never qualifies (FC-04).
# keyword_matched: a live context of the record (the user's, not deleted) whose keywords may
# be shown (COMPLETED, or the previous judgment while re-judged:
# pinlog_platform.contract.keyword_reads)
# has an active PUBLIC or PRIVATE_ONLY preset (the owner's view, §9) whose vector of this
# profile has a cosine to the query above :keyword_threshold.
SEARCH_SIMILAR = text(
    """
    SELECT record_id, context_id, similarity, EXISTS (
        SELECT 1
        FROM ai.context_embedding AS ke
        JOIN ai.context_ai_state AS ks ON ks.context_id = ke.context_id
        JOIN ai.context_keyword AS ck ON ck.context_id = ke.context_id
        JOIN ai.keyword_preset AS kp ON kp.id = ck.keyword_id
        JOIN ai.keyword_preset_embedding AS kv
          ON kv.preset_id = kp.id AND kv.embedding_profile = :profile
        WHERE ke.user_id = :user_id AND ke.record_id = best.record_id AND ke.is_deleted = false
          AND """  # noqa: S608 (a constant fragment)
    + keywords_shown("ks")
    + """
          AND kp.is_active AND kp.visibility IN ('PUBLIC', 'PRIVATE_ONLY')
          AND 1 - (kv.embedding <=> CAST(:query AS vector)) > :keyword_threshold
    ) AS keyword_matched
    FROM (
        SELECT DISTINCT ON (e.record_id) e.record_id, e.context_id,
               1 - (e.embedding <=> CAST(:query AS vector)) AS similarity
        FROM ai.context_embedding AS e
        JOIN ai.context_ai_state AS s ON s.context_id = e.context_id
        WHERE e.user_id = :user_id AND e.is_deleted = false
          AND e.embedding_profile = :profile AND s.embedding_status = 'COMPLETED'
          AND 1 - (e.embedding <=> CAST(:query AS vector)) <> 'NaN'::float8
        ORDER BY e.record_id, similarity DESC, e.context_id
    ) AS best
    ORDER BY similarity DESC, record_id
    LIMIT :limit
    """
)


async def search_similar(
    conn: AsyncConnection,
    *,
    user_id: int,
    query: np.ndarray,
    profile: str,
    limit: int,
    keyword_match_threshold: float,
) -> list[SearchHit]:
    """Records of ``user_id`` closest to ``query`` (float32 ``(dimension,)``), best first."""
    params = {
        "user_id": user_id,
        "query": query,
        "profile": profile,
        "limit": limit,
        "keyword_threshold": keyword_match_threshold,
    }
    return [
        SearchHit(
            row.record_id,
            row.context_id,
            clamp_similarity(float(row.similarity)),
            bool(row.keyword_matched),
        )
        for row in await conn.execute(SEARCH_SIMILAR, params)
    ]
