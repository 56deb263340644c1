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
NON_STATUS_LITERALS = frozenset({"NaN", "PUBLIC", "PRIVATE_ONLY", "{}", "similarity", "keyword"})

# The active presets the owner may see (PUBLIC or PRIVATE_ONLY, §9) that the query's meaning
# matches (pinlog_platform.contract.search.keyword_match): a cosine of the preset's vector of
# this profile to the query above :keyword_threshold and, when :keyword_top is above 0, among
# the :keyword_top closest (ties by the lower id; LIMIT NULL is no limit); a zero vector's NaN
# never matches (FC-04). Computed once per search. OFFSET 0 keeps the cosine out of the join:
# pushed into the preset-vector scan, it was computed once per preset pair (n^2 cosines)
# instead of once per preset.
_MATCHED_PRESETS = """
    matched AS MATERIALIZED (
        SELECT scored.id
        FROM (
            SELECT usable.id, 1 - (usable.embedding <=> CAST(:query AS vector)) AS cosine
            FROM (
                SELECT kp.id, kv.embedding
                FROM ai.keyword_preset AS kp
                JOIN ai.keyword_preset_embedding AS kv
                  ON kv.preset_id = kp.id AND kv.embedding_profile = :profile
                WHERE kp.is_active AND kp.visibility IN ('PUBLIC', 'PRIVATE_ONLY')
                OFFSET 0
            ) AS usable
            OFFSET 0
        ) AS scored
        WHERE scored.cosine > :keyword_threshold AND scored.cosine <> 'NaN'::float8
        ORDER BY scored.cosine DESC, scored.id
        LIMIT CAST(nullif(CAST(:keyword_top AS int), 0) AS bigint)
    )"""

# The user's live vectors of one profile whose embedding stage is COMPLETED, each with its
# cosine to the query, computed once per vector (a vector is about 6 kB, stored out of line:
# each evaluation reads it again). OFFSET 0 keeps the cosine in this scan (the NaN filter above
# it would otherwise compute it a second time). The status is read by the state row's key
# alone, so that no plan can reach it through the status index: as a join, tables without
# statistics yet (the first minutes of a deployment, or after a bulk load) were planned as a
# nested loop reading every COMPLETED state row once per vector.
_SCORED_VECTORS = """
            SELECT e.record_id, e.context_id,
                   1 - (e.embedding <=> CAST(:query AS vector)) AS similarity
            FROM ai.context_embedding AS e
            WHERE e.user_id = :user_id AND e.is_deleted = false
              AND e.embedding_profile = :profile
              AND (
                  SELECT s.embedding_status FROM ai.context_ai_state AS s
                  WHERE s.context_id = e.context_id
              ) = 'COMPLETED'
            OFFSET 0"""

# Exact cosine over one user's live, completed vectors of one profile; the best context per
# record; the limit applied after de-duplication (§7). NaN (a zero vector) never qualifies (FC-04).
# keyword_matched: a live context of the record (the user's, not deleted) whose keywords may
# be shown (COMPLETED, or the previous judgment while re-judged:
# pinlog_platform.contract.keyword_reads) carries a preset of `matched`. One row even when the
# user has no vector (matched_ids).
SEARCH_SIMILAR = text(
    "WITH"  # noqa: S608 (constant fragments)
    + _MATCHED_PRESETS
    + """
    SELECT (SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM matched) AS matched_ids,
           found.*
    FROM (VALUES (1)) AS one
    LEFT JOIN LATERAL (
        SELECT record_id, context_id, similarity, EXISTS (
            SELECT 1
            FROM ai.context_embedding AS ke
            WHERE ke.user_id = :user_id AND ke.record_id = best.record_id
              AND ke.is_deleted = false
              AND EXISTS (
                  SELECT 1 FROM ai.context_keyword AS ck
                  WHERE ck.context_id = ke.context_id
                    AND ck.keyword_id IN (SELECT id FROM matched)
                  OFFSET 0
              )
              AND EXISTS (
                  SELECT 1 FROM ai.context_ai_state AS ks
                  WHERE ks.context_id = ke.context_id AND """
    + keywords_shown("ks")
    + """
                  OFFSET 0
              )
            OFFSET 0
        ) AS keyword_matched
        FROM (
            SELECT DISTINCT ON (scored.record_id) scored.record_id, scored.context_id,
                   scored.similarity
            FROM ("""
    + _SCORED_VECTORS
    + """
            ) AS scored
            WHERE scored.similarity <> 'NaN'::float8
            ORDER BY scored.record_id, scored.similarity DESC, scored.context_id
        ) AS best
        ORDER BY similarity DESC, record_id
        LIMIT :limit
    ) AS found ON true
    """
)

# For the core's fused search (docs/contract.md §7, Addition "fused search"), given the ids of
# `matched` and the contexts the core's lists found:
#   kind 'similarity': each of :context_ids with a live, completed vector of this profile of
#     the user, and its cosine to the query;
#   kind 'keyword': the user's records carrying a keyword of :matched_ids that the owner may
#     see, on a live vector of this profile, each record's best such context (confidence, then
#     cosine), best confidence first, at most :limit.
SEARCH_ADDITIONS = text(
    """
    SELECT 'similarity' AS kind, record_id, context_id, similarity, NULL AS confidence
    FROM (
        SELECT e.record_id, e.context_id,
               1 - (e.embedding <=> CAST(:query AS vector)) AS similarity
        FROM ai.context_embedding AS e
        WHERE e.user_id = :user_id AND e.context_id = ANY(CAST(:context_ids AS bigint[]))
          AND e.is_deleted = false AND e.embedding_profile = :profile
          AND (
              SELECT s.embedding_status FROM ai.context_ai_state AS s
              WHERE s.context_id = e.context_id
          ) = 'COMPLETED'
        OFFSET 0
    ) AS listed
    WHERE similarity <> 'NaN'::float8
    UNION ALL
    SELECT 'keyword', record_id, context_id, similarity, confidence FROM (
        SELECT * FROM (
            SELECT DISTINCT ON (carrying.record_id) carrying.*
            FROM (
                SELECT ke.record_id, ke.context_id,
                       1 - (ke.embedding <=> CAST(:query AS vector)) AS similarity,
                       CAST(ck.confidence AS float8) AS confidence
                FROM ai.context_embedding AS ke
                JOIN ai.context_ai_state AS ks ON ks.context_id = ke.context_id
                JOIN ai.context_keyword AS ck ON ck.context_id = ke.context_id
                WHERE ke.user_id = :user_id AND ke.is_deleted = false
                  AND ke.embedding_profile = :profile
                  AND ck.keyword_id = ANY(CAST(:matched_ids AS int[]))
                  AND """  # noqa: S608 (a constant fragment)
    + keywords_shown("ks")
    + """
                OFFSET 0
            ) AS carrying
            WHERE carrying.similarity <> 'NaN'::float8
            ORDER BY carrying.record_id, carrying.confidence DESC NULLS LAST,
                     carrying.similarity DESC, carrying.context_id
        ) AS per_record
        ORDER BY confidence DESC NULLS LAST, similarity DESC, record_id
        LIMIT :limit
    ) AS keyword_hits
    """
)


@dataclass(frozen=True, slots=True)
class SimilarRecords:
    """The §7 list and the ids of the presets the query matched (``matched_ids``)."""

    hits: list[SearchHit]
    matched_ids: list[int]


@dataclass(frozen=True, slots=True)
class ContextSimilarity:
    context_id: int
    similarity: float


@dataclass(frozen=True, slots=True)
class KeywordHit:
    """A record's best context carrying a matched keyword; ``confidence`` None when the
    judgment recorded none."""

    record_id: int
    context_id: int
    similarity: float
    confidence: float | None


@dataclass(frozen=True, slots=True)
class SearchAdditions:
    context_similarities: list[ContextSimilarity]
    keyword_hits: list[KeywordHit]


async def search_similar(
    conn: AsyncConnection,
    *,
    user_id: int,
    query: np.ndarray,
    profile: str,
    limit: int,
    keyword_match_threshold: float,
    keyword_match_top: int = 0,
) -> SimilarRecords:
    """Records of ``user_id`` closest to ``query`` (float32 ``(dimension,)``), best first, and
    the matched presets (``keyword_match_top`` 0: every preset above the threshold)."""
    params = {
        "user_id": user_id,
        "query": query,
        "profile": profile,
        "limit": limit,
        "keyword_threshold": keyword_match_threshold,
        "keyword_top": keyword_match_top,
    }
    rows = (await conn.execute(SEARCH_SIMILAR, params)).all()
    hits = [
        SearchHit(
            row.record_id,
            row.context_id,
            clamp_similarity(float(row.similarity)),
            bool(row.keyword_matched),
        )
        for row in rows
        if row.record_id is not None
    ]
    return SimilarRecords(hits, [int(i) for i in rows[0].matched_ids])


async def search_additions(
    conn: AsyncConnection,
    *,
    user_id: int,
    query: np.ndarray,
    profile: str,
    context_ids: list[int],
    matched_ids: list[int],
    limit: int,
) -> SearchAdditions:
    """``SEARCH_ADDITIONS``: cosines of ``context_ids`` and the keyword hits."""
    params = {
        "user_id": user_id,
        "query": query,
        "profile": profile,
        "context_ids": context_ids,
        "matched_ids": matched_ids,
        "limit": limit,
    }
    similarities, keyword_hits = [], []
    for row in await conn.execute(SEARCH_ADDITIONS, params):
        similarity = clamp_similarity(float(row.similarity))
        if row.kind == "similarity":
            similarities.append(ContextSimilarity(int(row.context_id), similarity))
        else:
            confidence = None if row.confidence is None else float(row.confidence)
            keyword_hits.append(
                KeywordHit(int(row.record_id), int(row.context_id), similarity, confidence)
            )
    return SearchAdditions(similarities, keyword_hits)
