"""The two saves of §3: lock, re-check, write, transition, each one statement.

Each save is one data-modifying statement run on its own (autocommit: one statement, one
implicit transaction). Its first CTE, ``locked``, takes the state row ``FOR UPDATE`` and keeps
it only while the stage is still ours: ``PROCESSING`` with this claim's attempt (the fencing
token, docs/state-machine.md) and, for keywords, embedding ``COMPLETED``. Every write selects
``FROM locked``, so the state row is locked before any other row is touched (the lock order of
docs/lock-order.md), and a failed re-check (a cancellation, a reclaim) writes nothing: 0 rows,
a discarded result (§6 "not a failure"). The transitions keep their guards in their own WHERE
clauses as well. Nothing but SQL runs between the lock and the commit (§3.4).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import orjson

from app.repository.named_statements import compile_named
from app.repository.stage_pool import StagePool

# Storing one context's vector under its profile, the rows to store selected from a FROM item
# aliased ``src`` with a ``context_id`` column (the caller's, between the two fragments): the
# embedding save below and the backfill's save (``profile_vectors``). A vector of the same
# profile is replaced; is_deleted is deliberately not in the conflict SET list (§0).
STORE_VECTOR_FROM = """
        INSERT INTO ai.context_embedding
            (context_id, user_id, record_id, embedding, embedding_profile, updated_at)
        SELECT src.context_id, CAST(:user_id AS bigint), CAST(:record_id AS bigint),
               CAST(:embedding AS vector), CAST(:embedding_profile AS varchar), now()
        FROM """
STORE_VECTOR_ON_CONFLICT = """
        ON CONFLICT (context_id, embedding_profile) DO UPDATE SET
            user_id = EXCLUDED.user_id,
            record_id = EXCLUDED.record_id,
            embedding = EXCLUDED.embedding,
            updated_at = now()
        RETURNING context_id"""

# §3.2: store the vector and mark the embedding COMPLETED while attempt :attempt still owns the
# stage. is_deleted is deliberately not in the conflict SET list (§0). The same UPDATE starts
# the keyword stage when it is PENDING (§2 "Start" for keywords: it needs embedding COMPLETED,
# which this very UPDATE sets), so the keyword stage costs no claim of its own.
SAVE_EMBEDDING = compile_named(
    """
    WITH locked AS (
        SELECT context_id, keyword_status
        FROM ai.context_ai_state
        WHERE context_id = :context_id
          AND embedding_status = 'PROCESSING' AND embedding_attempt = :attempt
        FOR UPDATE
    ), stored AS ("""
    + STORE_VECTOR_FROM
    + "locked AS src"
    + STORE_VECTOR_ON_CONFLICT
    + """
    )
    UPDATE ai.context_ai_state AS s
    SET embedding_status = 'COMPLETED',
        keyword_status = CASE WHEN s.keyword_status = 'PENDING'
                              THEN 'PROCESSING' ELSE s.keyword_status END,
        keyword_attempt = CASE WHEN s.keyword_status = 'PENDING'
                               THEN s.keyword_attempt + 1 ELSE s.keyword_attempt END,
        updated_at = now()
    FROM locked AS l
    WHERE s.context_id = l.context_id
      AND s.embedding_status = 'PROCESSING' AND s.embedding_attempt = :attempt
      AND (SELECT count(*) FROM stored) = 1
    RETURNING CASE WHEN l.keyword_status = 'PENDING' THEN s.keyword_attempt END AS keyword_attempt
"""
)

# §3.3: replace the context's keyword rows, upsert the analysis row and mark the keyword stage
# COMPLETED while attempt :attempt still owns it. The INSERT reads the DELETE's output, which
# makes PostgreSQL finish the DELETE first: without that dependency the sub-statements run in
# an unspecified order and re-inserting a kept keyword would hit the primary key.
# :confidences are sent as float8 (3 decimals) and cast; :unmatched_concepts and :candidates
# (the [keyword_id, similarity] pairs judged among, §4 Addition "candidates kept") JSON text.
SAVE_KEYWORDS = compile_named("""
    WITH locked AS (
        SELECT context_id
        FROM ai.context_ai_state
        WHERE context_id = :context_id AND embedding_status = 'COMPLETED'
          AND keyword_status = 'PROCESSING' AND keyword_attempt = :attempt
        FOR UPDATE
    ), removed AS (
        DELETE FROM ai.context_keyword AS k
        USING locked AS l
        WHERE k.context_id = l.context_id
        RETURNING k.keyword_id
    ), inserted AS (
        INSERT INTO ai.context_keyword (context_id, keyword_id, confidence, preset_version)
        SELECT l.context_id, selected.keyword_id, selected.confidence,
               CAST(:preset_version AS int)
        FROM locked AS l,
             unnest(CAST(:keyword_ids AS int[]), CAST(CAST(:confidences AS float8[]) AS numeric[]))
                 AS selected(keyword_id, confidence)
        WHERE (SELECT count(*) FROM removed) >= 0
        RETURNING keyword_id
    ), analysed AS (
        INSERT INTO ai.context_keyword_analysis
            (context_id, preset_version, unmatched_concepts, model_profile, embedding_profile,
             candidates, updated_at)
        SELECT context_id, CAST(:preset_version AS int), CAST(:unmatched_concepts AS jsonb),
               CAST(:model_profile AS varchar), CAST(:embedding_profile AS varchar),
               CAST(:candidates AS jsonb), now()
        FROM locked
        ON CONFLICT (context_id) DO UPDATE SET
            preset_version = EXCLUDED.preset_version,
            unmatched_concepts = EXCLUDED.unmatched_concepts,
            candidates = EXCLUDED.candidates,
            model_profile = EXCLUDED.model_profile,
            embedding_profile = EXCLUDED.embedding_profile,
            updated_at = now()
        RETURNING context_id
    )
    UPDATE ai.context_ai_state AS s
    SET keyword_status = 'COMPLETED', updated_at = now()
    FROM locked AS l
    WHERE s.context_id = l.context_id AND s.embedding_status = 'COMPLETED'
      AND s.keyword_status = 'PROCESSING' AND s.keyword_attempt = :attempt
      AND (SELECT count(*) FROM analysed) = 1
    RETURNING (SELECT count(*) FROM inserted) AS keywords
""")


@dataclass(frozen=True, slots=True)
class EmbeddingSaved:
    """A stored vector; ``keyword_attempt`` is the keyword claim the same statement made
    (``None`` when the keyword stage was not ``PENDING``)."""

    keyword_attempt: int | None


async def save_embedding(
    stage_pool: StagePool,
    *,
    context_id: int,
    attempt: int,
    user_id: int,
    record_id: int,
    embedding: np.ndarray,
    embedding_profile: str,
) -> EmbeddingSaved | None:
    """Store ``embedding`` (float32 ``(dimension,)``) and complete the embedding stage if
    ``attempt`` still owns it (§3.2); ``None``: re-check failed, nothing written."""
    row = await stage_pool.fetch_row(
        SAVE_EMBEDDING,
        context_id=context_id,
        attempt=attempt,
        user_id=user_id,
        record_id=record_id,
        embedding=embedding,
        embedding_profile=embedding_profile,
    )
    if row is None:
        return None
    keyword_attempt = row["keyword_attempt"]
    return EmbeddingSaved(None if keyword_attempt is None else int(keyword_attempt))


async def save_keywords(
    stage_pool: StagePool,
    *,
    context_id: int,
    attempt: int,
    selections: Sequence[tuple[int, float]],
    preset_version: int,
    unmatched_concepts: Sequence[str],
    model_profile: str,
    embedding_profile: str,
    candidates: Sequence[tuple[int, float]] = (),
) -> bool:
    """Replace the keywords, write the analysis and complete the keyword stage if ``attempt``
    still owns it (§3.3); ``False``: re-check failed, nothing written.

    ``selections``: ``(keyword_id, confidence 0..1)`` pairs, zero allowed; confidences are
    stored with 3 decimals (``NUMERIC(4,3)``). ``embedding_profile``: the profile of the
    preset vectors the candidates were chosen by (a cutover re-judges other profiles').
    ``candidates``: the ``(keyword_id, cosine similarity)`` pairs the judge chose among, best
    first, stored in the same statement with 3 decimals (§4 Addition "candidates kept"; read
    by ``pinlog-core inspect``).
    """
    row = await stage_pool.fetch_row(
        SAVE_KEYWORDS,
        context_id=context_id,
        attempt=attempt,
        keyword_ids=[keyword_id for keyword_id, _ in selections],
        confidences=[round(confidence, 3) for _, confidence in selections],
        preset_version=preset_version,
        unmatched_concepts=json.dumps(list(unmatched_concepts), ensure_ascii=False),
        model_profile=model_profile,
        embedding_profile=embedding_profile,
        # orjson: a keyword save is on every context's path (a quarter of json.dumps's CPU).
        candidates=orjson.dumps([[int(k), round(float(sim), 3)] for k, sim in candidates]).decode(),
    )
    return row is not None
