"""The provider batches a worker submitted (``ai.provider_batch``, 0115) and the backfill rows
they hold (``ai.context_embedding_backfill.batch_id``); docs/operations.md "Backfill via the
Batch API", docs/contract.md §2 Deviation "batch-held work".

- **hold** (``HOLD_IN_BATCH``): one statement records the batch and gives each claimed row the
  batch's id, each only while its claim's attempt still owns it (``PROCESSING``, the attempt
  as fencing token). A held row is not reclaimed after the processing expiry
  (``profile_vectors.CLAIM_BACKFILL``) nor resent by the core.
- **lease** (``LEASE_BATCH``): the next unsettled batch of a profile not leased by another
  worker (``SKIP LOCKED``) and not polled within the poll interval, leased for
  ``lease_seconds``; so one worker polls a batch at a time, each batch about once an interval
  whatever the number of workers, and a killed worker's lease runs out.
- **return** (``RETURN_TO_SYNC``): rows a batch did not finish (expired, failed, cancelled, a
  provider-wide item error) go back to ``PENDING`` on the synchronous path (``via_batch``
  false, no batch id), only while this batch holds them.
- **fail** (``FAIL_HELD``): a row whose item the provider refused as the note's own fault ends
  ``FAILED`` with the reason, only while this batch and attempt hold it.

Results are saved by ``profile_vectors.save_backfill_vector``: the synchronous path's guarded,
fenced save. Every statement runs alone on the stage pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg

from app.repository.named_statements import compile_named
from app.repository.stage_pool import StagePool

# The empty array of an empty list; the kind of batch 0115 knows.
NON_STATUS_LITERALS = frozenset({"{}", "embed"})

# Record batch :batch_id of :items rows and hold the claimed rows (:context_ids, :attempts by
# position) in it; the ids held.
HOLD_IN_BATCH = compile_named("""
    WITH recorded AS (
        INSERT INTO ai.provider_batch (batch_id, kind, embedding_profile, status, items,
                                       input_file_id, estimated_tokens)
        VALUES (:batch_id, 'embed', :embedding_profile, :status, :items, :input_file_id,
                :estimated_tokens)
        RETURNING batch_id
    ), held AS (
        UPDATE ai.context_embedding_backfill AS b
        SET batch_id = (SELECT batch_id FROM recorded), updated_at = now()
        FROM unnest(CAST(:context_ids AS bigint[]), CAST(:attempts AS int[]))
             AS owned(context_id, attempt)
        WHERE b.embedding_profile = :embedding_profile AND b.context_id = owned.context_id
          AND b.status = 'PROCESSING' AND b.attempt = owned.attempt AND b.batch_id IS NULL
        RETURNING b.context_id
    )
    SELECT coalesce(array_agg(context_id ORDER BY context_id), '{}') AS context_ids FROM held
""")

# The next unsettled batch of :kind (embed, keyword) of :embedding_profile nobody leases and
# nobody polled within :every_seconds (a poll moves updated_at), leased for :lease_seconds.
LEASE_BATCH = compile_named("""
    UPDATE ai.provider_batch AS p
    SET lease_until = now() + make_interval(secs => :lease_seconds)
    WHERE p.batch_id = (
        SELECT q.batch_id FROM ai.provider_batch AS q
        WHERE q.kind = :kind AND q.embedding_profile = :embedding_profile AND NOT q.settled
          AND (q.lease_until IS NULL OR q.lease_until < now())
          AND (q.updated_at <= now() - make_interval(secs => :every_seconds)
               OR q.cancel_requested)
        ORDER BY q.updated_at, q.batch_id
        LIMIT 1
        FOR UPDATE SKIP LOCKED)
    RETURNING p.batch_id, p.status, p.items, p.estimated_tokens, p.cancel_requested,
              p.input_file_id
""")

# A poll's outcome: the provider's status and files; the lease is let go.
UPDATE_BATCH = compile_named("""
    UPDATE ai.provider_batch
    SET status = :status, output_file_id = :output_file_id, error_file_id = :error_file_id,
        lease_until = NULL, updated_at = now()
    WHERE batch_id = :batch_id
    RETURNING batch_id
""")

# The batch's results are saved and its unfinished rows returned: nothing more to do.
SETTLE_BATCH = compile_named("""
    UPDATE ai.provider_batch
    SET status = :status, settled = true, settled_tokens = :settled_tokens, lease_until = NULL,
        updated_at = now()
    WHERE batch_id = :batch_id AND NOT settled
    RETURNING batch_id
""")

# Rows :batch_id still holds (all of them when :context_ids is NULL) back to PENDING on the
# synchronous path; the ids returned, as an array.
RETURN_TO_SYNC = compile_named("""
    WITH returned AS (
        UPDATE ai.context_embedding_backfill AS b
        SET status = 'PENDING', via_batch = false, batch_id = NULL, failure_reason = NULL,
            updated_at = now()
        WHERE b.embedding_profile = :embedding_profile AND b.batch_id = :batch_id
          AND b.status = 'PROCESSING'
          AND (CAST(:context_ids AS bigint[]) IS NULL
               OR b.context_id = ANY(CAST(:context_ids AS bigint[])))
        RETURNING b.context_id
    )
    SELECT coalesce(array_agg(context_id ORDER BY context_id), '{}') AS context_ids
    FROM returned
""")

# A held row whose item is the note's own fault: FAILED with :reason, while :batch_id and
# :attempt hold it.
FAIL_HELD = compile_named("""
    UPDATE ai.context_embedding_backfill AS b
    SET status = 'FAILED', failure_reason = :reason, updated_at = now()
    WHERE b.embedding_profile = :embedding_profile AND b.context_id = :context_id
      AND b.batch_id = :batch_id AND b.attempt = :attempt AND b.status = 'PROCESSING'
    RETURNING b.context_id
""")


@dataclass(frozen=True, slots=True)
class LeasedBatch:
    """A batch this worker may poll now: its id, last polled ``status``, ``items``, the
    tokens counted at submission, whether the core asked it cancelled, and its input file."""

    batch_id: str
    status: str
    items: int
    estimated_tokens: int
    cancel_requested: bool
    input_file_id: str


@dataclass(frozen=True, slots=True)
class NewBatch:
    """A batch just created at the provider, as a hold records it in ``ai.provider_batch``
    (this module's ``hold`` and ``keyword_batches.hold``): its id, the embedding profile, its
    first ``status``, its input file and the tokens its inputs were estimated at."""

    batch_id: str
    embedding_profile: str
    status: str
    input_file_id: str
    estimated_tokens: int

    def params(self, items: int) -> dict[str, object]:
        """The ``ai.provider_batch`` row's parameters of a batch of ``items`` lines."""
        return {
            "batch_id": self.batch_id,
            "embedding_profile": self.embedding_profile,
            "status": self.status,
            "items": items,
            "input_file_id": self.input_file_id,
            "estimated_tokens": self.estimated_tokens,
        }


async def hold(
    stage_pool: StagePool, batch: NewBatch, *, claims: Sequence[tuple[int, int]]
) -> list[int]:
    """Record ``batch`` and hold ``claims`` (``(context_id, attempt)``) in it
    (``HOLD_IN_BATCH``); the context ids held."""
    row = await stage_pool.fetch_row(
        HOLD_IN_BATCH,
        **batch.params(len(claims)),
        context_ids=[c for c, _ in claims],
        attempts=[a for _, a in claims],
    )
    return held_ids(row)


def held_ids(row: asyncpg.Record | None) -> list[int]:
    """The ``context_ids`` array a statement returned (none when it returned no row)."""
    return [] if row is None else [int(c) for c in row["context_ids"]]


async def lease(
    stage_pool: StagePool,
    *,
    embedding_profile: str,
    lease_seconds: float,
    every_seconds: float,
    kind: str = "embed",
) -> LeasedBatch | None:
    """The next batch of ``kind`` to poll (``LEASE_BATCH``: not polled within
    ``every_seconds``, or asked cancelled), ``None`` when none is due."""
    row = await stage_pool.fetch_row(
        LEASE_BATCH,
        kind=kind,
        embedding_profile=embedding_profile,
        lease_seconds=float(lease_seconds),
        every_seconds=float(every_seconds),
    )
    if row is None:
        return None
    return LeasedBatch(
        str(row["batch_id"]),
        str(row["status"]),
        int(row["items"]),
        int(row["estimated_tokens"]),
        bool(row["cancel_requested"]),
        str(row["input_file_id"]),
    )


async def update(
    stage_pool: StagePool,
    *,
    batch_id: str,
    status: str,
    output_file_id: str | None,
    error_file_id: str | None,
) -> None:
    """Store a poll's outcome and let the lease go (``UPDATE_BATCH``)."""
    await stage_pool.fetch_row(
        UPDATE_BATCH,
        batch_id=batch_id,
        status=status,
        output_file_id=output_file_id,
        error_file_id=error_file_id,
    )


async def settle(stage_pool: StagePool, *, batch_id: str, status: str, tokens: int) -> None:
    """Mark the batch settled with its final ``status`` and the tokens its results reported."""
    await stage_pool.fetch_row(
        SETTLE_BATCH, batch_id=batch_id, status=status, settled_tokens=tokens
    )


async def return_to_sync(
    stage_pool: StagePool,
    *,
    batch_id: str,
    embedding_profile: str,
    context_ids: Sequence[int] | None,
) -> list[int]:
    """Rows ``batch_id`` holds (``None``: all) back to the synchronous path
    (``RETURN_TO_SYNC``); the ids returned."""
    row = await stage_pool.fetch_row(
        RETURN_TO_SYNC,
        batch_id=batch_id,
        embedding_profile=embedding_profile,
        context_ids=None if context_ids is None else list(context_ids),
    )
    return held_ids(row)


async def fail_held(
    stage_pool: StagePool,
    *,
    batch_id: str,
    embedding_profile: str,
    context_id: int,
    attempt: int,
    reason: str,
) -> bool:
    """End a held row ``FAILED`` with ``reason`` (``FAIL_HELD``); whether it did."""
    row = await stage_pool.fetch_row(
        FAIL_HELD,
        batch_id=batch_id,
        embedding_profile=embedding_profile,
        context_id=context_id,
        attempt=attempt,
        reason=reason,
    )
    return row is not None
