"""Vectors of a context under one embedding profile, outside the live embedding stage: the
re-embedding backfill (``ai.context_embedding_backfill``, 0060; docs/operations.md "Switching
the embedding profile"; docs/contract.md §1, Deviation "context vectors per profile").

The backfill follows the contract's rules for a stage, on its own row (never the live
stages' columns):

- **claim** (``CLAIM_BACKFILL``): a conditional ``UPDATE`` of the rows still ``PENDING``, or
  ``PROCESSING`` for longer than the processing expiry (a reclaim), ``attempt + 1`` as the
  fencing token. Rows another claimer holds are skipped (``SKIP LOCKED``), so concurrent
  workers never wait on each other and never both own a row. Like the live stages' start
  (``context_start``), a row is claimed only while its context is live (state not
  ``CANCELLED``) and the request's text digest and owner are the ones the core wrote on the
  state row (0006, 0020): a request with another text or owner claims nothing and no provider
  is called for it; the vector is stored under the state row's owner, never the request's.
  A row a provider batch holds (``batch_id``, 0115) is never reclaimed, however old: its
  batch returns it (``provider_batches``).
- **save** (``SAVE_BACKFILL_VECTOR``): one statement that locks the context's state row
  first (docs/lock-order.md), then the backfill row while ``PROCESSING`` with this attempt;
  the vector is written only while the live state is not ``CANCELLED`` (a delete, edit or
  withdrawal that committed first wins: the row ends ``CANCELLED``, nothing stored).
- **release** / **fail**: a fault that is not the note's own puts the row back to
  ``PENDING``; the note's own (the provider refused this text) ends it ``FAILED`` with the
  reason. Both only while this attempt still owns it.

Every statement runs alone (one implicit transaction) on the stage pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from app.repository.named_statements import compile_named
from app.repository.stage_pool import StagePool
from app.repository.stage_saves import STORE_VECTOR_FROM, STORE_VECTOR_ON_CONFLICT

# Words the statements quote that are not statuses: the empty array of an empty claim.
NON_STATUS_LITERALS = frozenset({"{}"})

# Claim the rows of :context_ids under :embedding_profile that are PENDING, or PROCESSING,
# stale and held by no provider batch (module docstring), each only while its context is live
# and the request's text digest (:text_sha256s, by position) and owner (:user_ids,
# :record_ids) are the ones the core wrote on the state row; the claimed ids, their new
# attempts and the state row's owner, as arrays.
# The state row is read, not locked: the save re-checks it under its lock (docs/lock-order.md).
CLAIM_BACKFILL = compile_named("""
    WITH asked AS (
        SELECT a.context_id, a.text_sha256, a.user_id, a.record_id
        FROM unnest(CAST(:context_ids AS bigint[]), CAST(:text_sha256s AS bytea[]),
                    CAST(:user_ids AS bigint[]), CAST(:record_ids AS bigint[]))
             AS a(context_id, text_sha256, user_id, record_id)
    ), claimable AS (
        SELECT b.context_id, s.user_id, s.record_id
        FROM ai.context_embedding_backfill AS b
        JOIN asked AS a ON a.context_id = b.context_id
        JOIN ai.context_ai_state AS s ON s.context_id = b.context_id
        WHERE b.embedding_profile = :embedding_profile
          AND s.embedding_status <> 'CANCELLED'
          AND s.text_sha256_from_core AND s.text_sha256 = a.text_sha256
          AND s.user_id = a.user_id AND s.record_id = a.record_id
          AND (b.status = 'PENDING'
               OR (b.status = 'PROCESSING' AND b.batch_id IS NULL
                   AND b.updated_at < now() - make_interval(secs => :expiry_seconds)))
        ORDER BY b.context_id
        FOR UPDATE OF b SKIP LOCKED
    ), claimed AS (
        UPDATE ai.context_embedding_backfill AS b
        SET status = 'PROCESSING', attempt = b.attempt + 1, failure_reason = NULL,
            updated_at = now()
        FROM claimable AS c
        WHERE b.embedding_profile = :embedding_profile AND b.context_id = c.context_id
        RETURNING b.context_id, b.attempt, c.user_id, c.record_id
    )
    SELECT coalesce(array_agg(context_id ORDER BY context_id), '{}') AS context_ids,
           coalesce(array_agg(attempt ORDER BY context_id), '{}') AS attempts,
           coalesce(array_agg(user_id ORDER BY context_id), '{}') AS user_ids,
           coalesce(array_agg(record_id ORDER BY context_id), '{}') AS record_ids
    FROM claimed
""")

# Store one backfilled vector while attempt :attempt owns the row and the context is live
# (module docstring); the row's new status (COMPLETED or CANCELLED), no row when the attempt
# no longer owns it. is_deleted is not in the conflict SET list (§0).
SAVE_BACKFILL_VECTOR = compile_named(
    """
    WITH live AS (
        SELECT s.context_id, s.embedding_status <> 'CANCELLED' AS alive
        FROM ai.context_ai_state AS s
        WHERE s.context_id = :context_id
        FOR UPDATE
    ), owned AS (
        SELECT b.context_id
        FROM ai.context_embedding_backfill AS b
        JOIN live AS l ON l.context_id = b.context_id
        WHERE b.embedding_profile = :embedding_profile AND b.status = 'PROCESSING'
          AND b.attempt = :attempt
        FOR UPDATE OF b
    ), stored AS ("""
    + STORE_VECTOR_FROM
    + "owned AS src JOIN live AS l ON l.context_id = src.context_id AND l.alive"
    + STORE_VECTOR_ON_CONFLICT
    + """
    )
    UPDATE ai.context_embedding_backfill AS b
    SET status = CASE WHEN (SELECT count(*) FROM stored) = 1
                      THEN 'COMPLETED' ELSE 'CANCELLED' END,
        updated_at = now()
    FROM owned AS o
    WHERE b.embedding_profile = :embedding_profile AND b.context_id = o.context_id
      AND b.status = 'PROCESSING' AND b.attempt = :attempt
    RETURNING b.status
"""
)

# Settle claimed rows without a vector: back to PENDING (:reason NULL: not the note's fault)
# or FAILED with :reason, each only while its attempt still owns it.
SETTLE_BACKFILL = compile_named("""
    UPDATE ai.context_embedding_backfill AS b
    SET status = CASE WHEN CAST(:reason AS varchar) IS NULL THEN 'PENDING' ELSE 'FAILED' END,
        failure_reason = CAST(:reason AS varchar),
        updated_at = now()
    FROM unnest(CAST(:context_ids AS bigint[]), CAST(:attempts AS int[]))
         AS owned(context_id, attempt)
    WHERE b.embedding_profile = :embedding_profile AND b.context_id = owned.context_id
      AND b.status = 'PROCESSING' AND b.attempt = owned.attempt
    RETURNING b.context_id
""")


@dataclass(frozen=True, slots=True)
class BackfillClaim:
    """One claimed backfill row: the context, the attempt that owns it (fencing token) and
    the owner the core wrote on the context's state row (what the vector is stored under)."""

    context_id: int
    attempt: int
    user_id: int
    record_id: int


@dataclass(frozen=True, slots=True)
class BackfillAsk:
    """One context a backfill request asks for: its id, the digest of the text it sent
    (``pinlog_platform.contract.text_fingerprint``, 32 bytes) and the owner it named."""

    context_id: int
    text_sha256: bytes
    user_id: int
    record_id: int


def claim_params(
    asks: Sequence[BackfillAsk], embedding_profile: str, expiry_seconds: float
) -> dict[str, object]:
    """A claim's parameters: ``asks`` as arrays by position (``:context_ids``,
    ``:text_sha256s``, ``:user_ids``, ``:record_ids``), the profile and the processing expiry
    (seconds); this module's ``claim`` and ``keyword_batches.claim``."""
    return {
        "embedding_profile": embedding_profile,
        "context_ids": [a.context_id for a in asks],
        "text_sha256s": [a.text_sha256 for a in asks],
        "user_ids": [a.user_id for a in asks],
        "record_ids": [a.record_id for a in asks],
        "expiry_seconds": float(expiry_seconds),
    }


async def claim(
    stage_pool: StagePool,
    *,
    embedding_profile: str,
    asks: Sequence[BackfillAsk],
    expiry_seconds: float,
) -> list[BackfillClaim]:
    """Claim what may be claimed of ``asks`` (``CLAIM_BACKFILL``: open or stale, the context
    live, text digest and owner the core's), ascending by id; ids must be distinct."""
    row = await stage_pool.fetch_row(
        CLAIM_BACKFILL, **claim_params(asks, embedding_profile, expiry_seconds)
    )
    if row is None:
        return []
    return [
        BackfillClaim(int(context_id), int(attempt), int(user_id), int(record_id))
        for context_id, attempt, user_id, record_id in zip(
            row["context_ids"], row["attempts"], row["user_ids"], row["record_ids"], strict=True
        )
    ]


async def save_backfill_vector(
    stage_pool: StagePool,
    claimed: BackfillClaim,
    *,
    embedding_profile: str,
    embedding: np.ndarray,
) -> str | None:
    """Store ``embedding`` (float32 ``(dimension,)``) for a claimed row under the owner its
    state row names (``claimed.user_id``, ``claimed.record_id``): ``'COMPLETED'``,
    ``'CANCELLED'`` (the context was deleted meanwhile; nothing stored) or ``None`` (the
    attempt no longer owns the row; nothing written)."""
    row = await stage_pool.fetch_row(
        SAVE_BACKFILL_VECTOR,
        context_id=claimed.context_id,
        attempt=claimed.attempt,
        embedding_profile=embedding_profile,
        user_id=claimed.user_id,
        record_id=claimed.record_id,
        embedding=embedding,
    )
    return None if row is None else str(row["status"])


async def settle(
    stage_pool: StagePool,
    claims: Sequence[BackfillClaim],
    *,
    embedding_profile: str,
    reason: str | None,
) -> None:
    """Rows of ``claims`` back to ``PENDING`` (``reason`` ``None``) or ``FAILED`` with
    ``reason`` (a ``FailureReason`` value), each while its attempt owns it."""
    if not claims:
        return
    await stage_pool.fetch_row(
        SETTLE_BACKFILL,
        embedding_profile=embedding_profile,
        context_ids=[c.context_id for c in claims],
        attempts=[c.attempt for c in claims],
        reason=reason,
    )
