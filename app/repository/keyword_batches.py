"""Keyword stages judged through the provider's Batch API: a ``reprocess keywords --via
batch`` (``ai.context_ai_state.keyword_via_batch`` / ``keyword_batch_id`` and
``ai.keyword_batch_item``, 0120; docs/operations.md "Reprocess via the Batch API";
docs/contract.md §2 and §9, Deviation "batch-held work").

- **claim** (``CLAIM_FOR_BATCH``): the keyword stages of the asked contexts that the core
  marked for the Batch API, ``PENDING`` (or ``PROCESSING`` past the processing expiry and held
  by no batch: a submission that never recorded its batch), the embedding stage ``COMPLETED``
  with a live vector of the profile, and the request's text digest and owner the ones the
  core wrote; ``keyword_attempt + 1`` as the fencing token, as the synchronous claim. Rows
  locked elsewhere are skipped (``SKIP LOCKED``), in id order.
- **hold** (``HOLD_KEYWORDS``): one statement records the batch (kind ``keyword``), gives each
  claimed stage the batch's id while its attempt still owns it, and stores what its save will
  need (the candidates, the list version and profile). A held stage is not reclaimed after the
  processing expiry (``context_ai_state.CLAIM_KEYWORD``), nor re-requested by the rescan nor
  failed by the finalizer (the core's ``context_ai_state``).
- **return** (``RETURN_TO_SYNC``): a stage the batch did not finish loses its batch and its
  mark and stays ``PROCESSING`` (the worker never moves a stage back to ``PENDING``, §2): the
  normal path takes it over after the processing expiry, as after a transient fault.
- **fail** (``FAIL_HELD``): the note's own fault ends the stage ``FAILED`` with the reason,
  only while this batch and attempt hold it.

Results are saved by ``stage_saves.save_keywords``: the synchronous path's guarded, fenced
save (a context deleted or edited meanwhile is ``CANCELLED``: nothing is written). Every
statement runs alone on the stage pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import orjson

from app.repository.db import to_array
from app.repository.named_statements import compile_named
from app.repository.profile_vectors import BackfillAsk, claim_params
from app.repository.provider_batches import NewBatch, held_ids
from app.repository.stage_pool import StagePool

# Words the statements quote that are not statuses: the empty array, the batch's kind.
NON_STATUS_LITERALS = frozenset({"{}", "keyword"})

# Claim the marked keyword stages of :context_ids (module docstring), each only while the
# request's text digest (:text_sha256s, by position) and owner (:user_ids, :record_ids) are the
# core's and a live vector of :embedding_profile exists; the ids claimed and their attempts.
CLAIM_FOR_BATCH = compile_named("""
    WITH asked AS (
        SELECT a.context_id, a.text_sha256, a.user_id, a.record_id
        FROM unnest(CAST(:context_ids AS bigint[]), CAST(:text_sha256s AS bytea[]),
                    CAST(:user_ids AS bigint[]), CAST(:record_ids AS bigint[]))
             AS a(context_id, text_sha256, user_id, record_id)
    ), claimable AS (
        SELECT s.context_id
        FROM ai.context_ai_state AS s
        JOIN asked AS a ON a.context_id = s.context_id
        WHERE s.keyword_via_batch AND s.embedding_status = 'COMPLETED'
          AND s.text_sha256_from_core AND s.text_sha256 = a.text_sha256
          AND s.user_id = a.user_id AND s.record_id = a.record_id
          AND (s.keyword_status = 'PENDING'
               OR (s.keyword_status = 'PROCESSING' AND s.keyword_batch_id IS NULL
                   AND s.updated_at < now() - make_interval(secs => :expiry_seconds)))
          AND EXISTS (SELECT 1 FROM ai.context_embedding AS e
                      WHERE e.context_id = s.context_id
                        AND e.embedding_profile = :embedding_profile AND NOT e.is_deleted)
        ORDER BY s.context_id
        FOR UPDATE OF s SKIP LOCKED
    ), claimed AS (
        UPDATE ai.context_ai_state AS s
        SET keyword_status = 'PROCESSING', keyword_attempt = s.keyword_attempt + 1,
            keyword_batch_id = NULL, updated_at = now()
        FROM claimable AS c
        WHERE s.context_id = c.context_id
        RETURNING s.context_id, s.keyword_attempt AS attempt
    )
    SELECT coalesce(array_agg(context_id ORDER BY context_id), '{}') AS context_ids,
           coalesce(array_agg(attempt ORDER BY context_id), '{}') AS attempts
    FROM claimed
""")

# The live vector of :context_id under :embedding_profile (the candidates are chosen by it).
READ_VECTOR = compile_named("""
    SELECT e.embedding FROM ai.context_embedding AS e
    WHERE e.context_id = :context_id AND e.embedding_profile = :embedding_profile
      AND NOT e.is_deleted
""")

# Record keyword batch :batch_id, hold the claimed stages (:context_ids, :attempts by
# position) in it and store each one's :candidates (JSON, by position); the ids held.
HOLD_KEYWORDS = compile_named("""
    WITH recorded AS (
        INSERT INTO ai.provider_batch (batch_id, kind, embedding_profile, status, items,
                                       input_file_id, estimated_tokens)
        VALUES (:batch_id, 'keyword', :embedding_profile, :status, :items, :input_file_id,
                :estimated_tokens)
        RETURNING batch_id
    ), owned AS (
        SELECT o.context_id, o.attempt, o.candidates
        FROM unnest(CAST(:context_ids AS bigint[]), CAST(:attempts AS int[]),
                    CAST(:candidates AS text[])) AS o(context_id, attempt, candidates)
    ), locked AS (
        SELECT s.context_id
        FROM ai.context_ai_state AS s
        JOIN owned AS o ON o.context_id = s.context_id
        WHERE s.keyword_status = 'PROCESSING' AND s.keyword_attempt = o.attempt
          AND s.keyword_batch_id IS NULL
        ORDER BY s.context_id
        FOR UPDATE OF s
    ), held AS (
        UPDATE ai.context_ai_state AS s
        SET keyword_batch_id = (SELECT batch_id FROM recorded), updated_at = now()
        FROM locked AS l
        WHERE s.context_id = l.context_id
        RETURNING s.context_id
    ), items AS (
        INSERT INTO ai.keyword_batch_item (batch_id, context_id, attempt, preset_version,
                                           embedding_profile, candidates)
        SELECT (SELECT batch_id FROM recorded), o.context_id, o.attempt, :preset_version,
               :embedding_profile, CAST(o.candidates AS jsonb)
        FROM owned AS o JOIN held AS h ON h.context_id = o.context_id
        RETURNING context_id
    )
    SELECT coalesce(array_agg(context_id ORDER BY context_id), '{}') AS context_ids
    FROM items
""")

# What the saves of batch :batch_id need: each held item's attempt and candidates (JSON), the
# list version and profile they were chosen under.
READ_ITEMS = compile_named("""
    SELECT coalesce(array_agg(context_id ORDER BY context_id), '{}') AS context_ids,
           coalesce(array_agg(attempt ORDER BY context_id), '{}') AS attempts,
           coalesce(array_agg(CAST(candidates AS text) ORDER BY context_id), '{}') AS candidates,
           min(preset_version) AS preset_version, min(embedding_profile) AS embedding_profile
    FROM ai.keyword_batch_item
    WHERE batch_id = :batch_id
""")

# Stages :batch_id still holds (all when :context_ids is NULL) back to the normal path: no
# batch, no mark, left PROCESSING (module docstring); locked in id order; the ids returned.
RETURN_TO_SYNC = compile_named("""
    WITH locked AS (
        SELECT s.context_id
        FROM ai.context_ai_state AS s
        WHERE s.keyword_batch_id = :batch_id AND s.keyword_status = 'PROCESSING'
          AND (CAST(:context_ids AS bigint[]) IS NULL
               OR s.context_id = ANY(CAST(:context_ids AS bigint[])))
        ORDER BY s.context_id
        FOR UPDATE OF s
    ), returned AS (
        UPDATE ai.context_ai_state AS s
        SET keyword_batch_id = NULL, keyword_via_batch = false, updated_at = now()
        FROM locked AS l
        WHERE s.context_id = l.context_id
        RETURNING s.context_id
    )
    SELECT coalesce(array_agg(context_id ORDER BY context_id), '{}') AS context_ids
    FROM returned
""")

# A held stage whose item is the note's own fault: FAILED with :reason, while :batch_id and
# :attempt hold it.
FAIL_HELD = compile_named("""
    UPDATE ai.context_ai_state
    SET keyword_status = 'FAILED', keyword_failure = :reason, keyword_batch_id = NULL,
        keyword_via_batch = false, updated_at = now()
    WHERE context_id = :context_id AND keyword_batch_id = :batch_id
      AND keyword_attempt = :attempt AND keyword_status = 'PROCESSING'
    RETURNING context_id
""")

# A settled batch's items: nothing more reads them.
DELETE_ITEMS = compile_named("""
    WITH deleted AS (
        DELETE FROM ai.keyword_batch_item WHERE batch_id = :batch_id RETURNING context_id
    )
    SELECT count(*) AS deleted FROM deleted
""")


# A context the core asked judged by batch: the same facts a backfill's claim checks.
KeywordAsk = BackfillAsk


@dataclass(frozen=True, slots=True)
class HeldItem:
    """A stage a keyword batch holds: its claim's ``attempt`` and the ``candidates``
    (``(keyword_id, cosine)``, best first) the judge was asked to choose among."""

    context_id: int
    attempt: int
    candidates: tuple[tuple[int, float], ...]


@dataclass(frozen=True, slots=True)
class BatchItems:
    """The held items of one batch by context id, and the list version and profile their
    candidates came from."""

    items: dict[int, HeldItem]
    preset_version: int
    embedding_profile: str


async def claim(
    stage_pool: StagePool,
    *,
    embedding_profile: str,
    asks: Sequence[KeywordAsk],
    expiry_seconds: float,
) -> list[tuple[int, int]]:
    """Claim what may be claimed of ``asks`` (``CLAIM_FOR_BATCH``); ``(context_id,
    attempt)`` ascending. Ids must be distinct."""
    row = await stage_pool.fetch_row(
        CLAIM_FOR_BATCH, **claim_params(asks, embedding_profile, expiry_seconds)
    )
    if row is None:
        return []
    return [(int(c), int(a)) for c, a in zip(row["context_ids"], row["attempts"], strict=True)]


async def read_vector(
    stage_pool: StagePool, *, context_id: int, embedding_profile: str
) -> np.ndarray | None:
    """The live vector of ``context_id`` under ``embedding_profile`` (``None``: none)."""
    row = await stage_pool.fetch_row(
        READ_VECTOR, context_id=context_id, embedding_profile=embedding_profile
    )
    return None if row is None else to_array(row["embedding"])


async def hold(
    stage_pool: StagePool, batch: NewBatch, *, preset_version: int, held: Sequence[HeldItem]
) -> list[int]:
    """Record ``batch`` and hold ``held`` in it (``HOLD_KEYWORDS``); the context ids held."""
    row = await stage_pool.fetch_row(
        HOLD_KEYWORDS,
        **batch.params(len(held)),
        preset_version=preset_version,
        context_ids=[h.context_id for h in held],
        attempts=[h.attempt for h in held],
        candidates=[orjson.dumps([list(c) for c in h.candidates]).decode() for h in held],
    )
    return held_ids(row)


async def read_items(stage_pool: StagePool, *, batch_id: str) -> BatchItems:
    """The items ``batch_id`` was submitted with (``READ_ITEMS``)."""
    row = await stage_pool.fetch_row(READ_ITEMS, batch_id=batch_id)
    items: dict[int, HeldItem] = {}
    if row is None or row["preset_version"] is None:
        return BatchItems(items, 0, "")
    for context_id, attempt, candidates in zip(
        row["context_ids"], row["attempts"], row["candidates"], strict=True
    ):
        pairs = tuple((int(k), float(s)) for k, s in orjson.loads(candidates))
        items[int(context_id)] = HeldItem(int(context_id), int(attempt), pairs)
    return BatchItems(items, int(row["preset_version"]), str(row["embedding_profile"]))


async def return_to_sync(
    stage_pool: StagePool, *, batch_id: str, context_ids: Sequence[int] | None
) -> list[int]:
    """Stages ``batch_id`` holds (``None``: all) back to the normal path (``RETURN_TO_SYNC``);
    the ids returned."""
    row = await stage_pool.fetch_row(
        RETURN_TO_SYNC,
        batch_id=batch_id,
        context_ids=None if context_ids is None else list(context_ids),
    )
    return held_ids(row)


async def fail_held(
    stage_pool: StagePool, *, batch_id: str, context_id: int, attempt: int, reason: str
) -> bool:
    """End a held stage ``FAILED`` with ``reason`` (``FAIL_HELD``); whether it did."""
    row = await stage_pool.fetch_row(
        FAIL_HELD, batch_id=batch_id, context_id=context_id, attempt=attempt, reason=reason
    )
    return row is not None


async def delete_items(stage_pool: StagePool, *, batch_id: str) -> int:
    """Forget a settled batch's items (``DELETE_ITEMS``); how many."""
    row = await stage_pool.fetch_row(DELETE_ITEMS, batch_id=batch_id)
    return 0 if row is None else int(row["deleted"])
