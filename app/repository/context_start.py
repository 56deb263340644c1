"""Starting a context (§3.1 with §2's embedding start): one statement, one round trip.

The pre-check, the owner and text checks and the embedding claim are one data-modifying
statement: a CTE locks the state row and reads what the pre-check needs (both statuses, the
owner facts, the text fingerprint); the claim ``UPDATE`` selects from it, so its guard is still
the contract's WHERE clause (§2 "Start"), plus "the owner matches". The claim also records the
first claiming request's text digest and owner on the row (``0009_state_row_fingerprint.sql``)
at no extra write. The stored vector is read only when the embedding stage is ``COMPLETED``
(resume, §3.2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from app.repository.db import to_array
from app.repository.named_statements import compile_named
from app.repository.stage_pool import StagePool
from pinlog_platform.contract.states import CLAIMABLE, Status

# Pre-check + owner/text check + embedding start or reclaim (§2, §3.1), in one statement.
# The owner reference is the core's user_id/record_id (0006) when written, else the first
# claiming request's (seen_*); a request naming another owner claims nothing. A request whose
# text differs from the digest the core wrote (0020) claims nothing either. A PROCESSING stage
# still at :abandoned_attempt (an attempt this process gave up; NULL: none) is taken over at
# once (context_ai_state.CLAIM_EMBEDDING).
START_CONTEXT = compile_named("""
    WITH previous AS (
        SELECT s.context_id, s.embedding_status, s.keyword_status,
               s.user_id IS NOT NULL AS owner_from_core,
               CASE WHEN s.user_id IS NOT NULL
                        THEN s.user_id = :user_id AND s.record_id = :record_id
                    WHEN s.seen_user_id IS NOT NULL
                        THEN s.seen_user_id = :user_id AND s.seen_record_id = :record_id
                    ELSE true END AS same_owner,
               s.text_sha256 IS NULL OR s.text_sha256 = :text_sha256 AS same_text,
               s.text_sha256_from_core AS text_from_core
        FROM ai.context_ai_state AS s
        WHERE s.context_id = :context_id
        FOR UPDATE
    ), claimed AS (
        UPDATE ai.context_ai_state AS s
        SET embedding_status = 'PROCESSING',
            embedding_attempt = s.embedding_attempt + 1,
            updated_at = now(),
            text_sha256 = coalesce(s.text_sha256, :text_sha256),
            seen_user_id = coalesce(s.seen_user_id, :user_id),
            seen_record_id = coalesce(s.seen_record_id, :record_id)
        FROM previous AS p
        WHERE s.context_id = p.context_id
          AND p.same_owner
          AND (p.same_text OR NOT p.text_from_core)
          AND s.embedding_status IN ('PENDING', 'PROCESSING')
          AND (s.embedding_status = 'PENDING'
               OR s.updated_at < now() - make_interval(secs => :expiry_seconds)
               OR s.embedding_attempt = CAST(:abandoned_attempt AS int))
        RETURNING s.embedding_attempt AS attempt
    )
    SELECT p.embedding_status, p.keyword_status, p.owner_from_core, p.same_owner, p.same_text,
           p.text_from_core,
           (SELECT attempt FROM claimed) AS embedding_attempt,
           e.embedding, e.embedding_profile,
           EXISTS (SELECT 1 FROM ai.context_embedding_backfill AS b
                   WHERE b.embedding_profile = :embedding_profile
                     AND b.context_id = p.context_id
                     AND b.status IN ('PENDING', 'PROCESSING')) AS vector_coming
    FROM previous AS p
    LEFT JOIN LATERAL (
        SELECT v.embedding, v.embedding_profile
        FROM ai.context_embedding AS v
        WHERE v.context_id = p.context_id AND p.embedding_status = 'COMPLETED'
        ORDER BY v.embedding_profile = :embedding_profile DESC
        LIMIT 1
    ) AS e ON true
""")


@dataclass(frozen=True, slots=True)
class ContextStart:
    """What starting a context found and did (§3.1, §2).

    Statuses are those just before the statement. ``embedding_attempt`` is the claim's fencing
    token when this request now owns the embedding stage, else ``None``. ``embedding`` (float32
    ``(dimension,)``) and ``embedding_profile`` are the stored vector when the embedding stage
    was ``COMPLETED``. ``same_owner`` is false when the request names another user or record
    than the reference (``owner_from_core``: the core's columns; else the first request's).
    The vector is this worker's profile's when the context has one (0060: a vector per
    profile), else another profile's, which the stages treat as a mismatch (§5), unless
    ``vector_coming``: a re-embedding backfill of this worker's profile has the context still
    open, so its vector of this profile is on its way (a switch is under way).
    ``same_text`` is false when the request's text digest differs from the row's;
    ``text_from_core``: that digest is the one the core committed (0020), so the request is
    refused, else it is the first claiming request's and the mismatch is only reported.
    """

    embedding_status: Status
    keyword_status: Status
    owner_from_core: bool
    same_owner: bool
    same_text: bool
    text_from_core: bool
    embedding_attempt: int | None
    embedding: np.ndarray | None
    embedding_profile: str | None
    vector_coming: bool = False

    @property
    def anything_to_do(self) -> bool:
        """False when neither stage may still be claimed (§3.1: stop)."""
        return self.embedding_status in CLAIMABLE or self.keyword_status in CLAIMABLE

    @property
    def embedding_reclaimed(self) -> bool:
        """A stale ``PROCESSING`` embedding stage was taken over (§2: WARNING, counted)."""
        return self.embedding_attempt is not None and self.embedding_status is Status.PROCESSING


async def start(
    stage_pool: StagePool,
    *,
    context_id: int,
    user_id: int,
    record_id: int,
    text_sha256: bytes,
    expiry_seconds: float,
    embedding_profile: str,
    abandoned_attempt: int | None = None,
) -> ContextStart | None:
    """Run ``START_CONTEXT``; ``None`` when there is no state row (§3.1: stop).

    ``text_sha256``: 32 bytes; ``expiry_seconds``: the processing expiry (§2);
    ``embedding_profile``: the worker's, whose stored vector is read; ``abandoned_attempt``:
    the embedding attempt this process gave up, if any (taken over at once). Never raises to
    steer the flow; database errors are raised as ``StagePool.fetch_row`` documents.
    """
    row = await stage_pool.fetch_row(
        START_CONTEXT,
        context_id=context_id,
        user_id=user_id,
        record_id=record_id,
        text_sha256=text_sha256,
        expiry_seconds=float(expiry_seconds),
        embedding_profile=embedding_profile,
        abandoned_attempt=abandoned_attempt,
    )
    if row is None:
        return None
    attempt = row["embedding_attempt"]
    return ContextStart(
        embedding_status=Status(row["embedding_status"]),
        keyword_status=Status(row["keyword_status"]),
        owner_from_core=bool(row["owner_from_core"]),
        same_owner=bool(row["same_owner"]),
        same_text=bool(row["same_text"]),
        text_from_core=bool(row["text_from_core"]),
        embedding_attempt=None if attempt is None else int(attempt),
        embedding=to_array(row["embedding"]),
        embedding_profile=row["embedding_profile"],
        vector_coming=bool(row["vector_coming"]),
    )
