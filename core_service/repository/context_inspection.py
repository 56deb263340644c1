"""What ``pinlog-core inspect`` reads of one context (docs/operations.md "Looking at one
note"): its core row, both stages of its state row with the last dispatch a worker took, the
judgment with the candidates it chose among, and its vectors by profile. Read-only; one
statement. The note's text is read only when asked for (``with_text``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

# The JSON keys INSPECT_CONTEXT quotes (tests/platform/test_stage_vocabulary.py).
NON_STATUS_LITERALS = frozenset(
    {"keywordId", "code", "similarity", "confidence", "presetVersion", "profile", "deleted",
     "updatedAt"}
)  # fmt: skip

# One row per context: the core's facts, the state row (whole, as JSON, so that every stage's
# status, attempt and failure columns are read by the caller from STAGE_ORDER and a new stage
# needs no edit here; the core names no attempt column in SQL), the last dispatch of 0096, the
# judgment (0095's candidates with their presets' codes, the
# selected keywords with confidence and preset version) and the vectors by profile, each
# aggregated to JSON so that one round trip reads it all. :with_text gates the body.
INSPECT_CONTEXT = text(
    """
    SELECT c.id AS context_id, c.record_id, c.member_id, c.created_at,
           c.origin_created_at, c.deleted_at, c.replaced_by,
           CASE WHEN CAST(:with_text AS boolean) THEN c.body END AS body,
           r.deleted_at AS record_deleted_at, m.deleted_at AS member_deleted_at,
           to_jsonb(s) AS stages,
           s.context_id IS NOT NULL AS has_state,
           s.retry_count, s.updated_at AS state_updated_at, s.rescanned_at,
           s.dispatch_accepted_at, s.next_dispatch_at,
           s.last_dispatch_at, s.last_dispatch_worker, s.last_dispatch_outcome,
           a.context_id IS NOT NULL AS has_judgment,
           a.preset_version, a.model_profile, a.embedding_profile AS judged_profile,
           a.unmatched_concepts, a.updated_at AS judged_at,
           (SELECT json_agg(json_build_object(
                       'keywordId', cand.keyword_id, 'code', p.code,
                       'similarity', cand.similarity) ORDER BY cand.position)
            FROM jsonb_array_elements(a.candidates) WITH ORDINALITY
                 AS item(pair, position)
            CROSS JOIN LATERAL (
                SELECT CAST(item.pair ->> 0 AS int) AS keyword_id,
                       CAST(item.pair ->> 1 AS float8) AS similarity,
                       item.position) AS cand
            LEFT JOIN ai.keyword_preset AS p ON p.id = cand.keyword_id) AS candidates,
           (SELECT json_agg(json_build_object(
                       'keywordId', k.keyword_id, 'code', p.code,
                       'confidence', k.confidence, 'presetVersion', k.preset_version)
                   ORDER BY k.confidence DESC, k.keyword_id)
            FROM ai.context_keyword AS k
            LEFT JOIN ai.keyword_preset AS p ON p.id = k.keyword_id
            WHERE k.context_id = c.id) AS selected,
           (SELECT json_agg(json_build_object(
                       'profile', e.embedding_profile, 'deleted', e.is_deleted,
                       'updatedAt', e.updated_at) ORDER BY e.embedding_profile)
            FROM ai.context_embedding AS e
            WHERE e.context_id = c.id) AS vectors
    FROM core.context AS c
    JOIN core.record AS r ON r.id = c.record_id
    JOIN core.member AS m ON m.id = c.member_id
    LEFT JOIN ai.context_ai_state AS s ON s.context_id = c.id
    LEFT JOIN ai.context_keyword_analysis AS a ON a.context_id = c.id
    WHERE c.id = :context_id
    """
)


async def inspect(
    conn: AsyncConnection, context_id: int, *, with_text: bool
) -> Mapping[str, Any] | None:
    """The row of ``INSPECT_CONTEXT`` for ``context_id`` as a mapping (JSON columns decoded:
    ``stages`` the state row's columns by name or ``None``; ``candidates``, ``selected``,
    ``vectors`` lists or ``None``); ``None`` when no such context. ``body`` is ``None`` unless
    ``with_text``."""
    result = await conn.execute(INSPECT_CONTEXT, {"context_id": context_id, "with_text": with_text})
    row = result.mappings().one_or_none()
    return None if row is None else dict(row)
