"""``ai.context_ai_state`` as the core service writes it (§0, §2, §9).

The core side creates rows (``PENDING``/``PENDING``/0), cancels them, spends ``retry_count`` on
accepted re-requests (docs/rescan.md "Budget") and finalizes exhausted work. It never writes
``PROCESSING`` or ``COMPLETED``, nor a stage's attempt column. Each statement below is one
``pinlog_platform.contract.states.CoreOperation``; ``CORE_TRANSITIONS`` is what it may do to a
stage's
status, and ``tests/core/repository/test_core_transition_table.py`` drives it from every
status. Multi-row statements lock in ``context_id`` order (waiting) or skip locked rows (the
scheduler), so they can never deadlock with each other or with a worker's save
(docs/lock-order.md).

Staleness is judged by the stage that would run next (embedding while unfinished, else keyword
once embedding is ``COMPLETED``): ``PENDING`` older than the pending expiry, ``PROCESSING``
older than the processing expiry, measured on ``updated_at`` (the worker's progress clock) and
on ``rescanned_at`` (the last re-request), both with the database clock (FC-06). The rescan
never writes ``updated_at``: the worker's reclaim rule (§2) must still see the stage as stale
when the rescan's request arrives (docs/rescan.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from pinlog_platform.contract.states import STAGE_ORDER, Status
from pinlog_platform.contract.states.failure_reasons import FailureReason
from pinlog_platform.contract.text_fingerprint import fingerprint

# The columns of a new context's state row (here and in ``context_writes``).
INSERT_PENDING_STATE_COLUMNS = """(
        context_id, embedding_status, keyword_status, retry_count, updated_at, user_id, record_id,
        text_sha256, text_sha256_from_core)"""

# Create: both stages PENDING, no retries spent, the owner as the core knows it and the digest
# of the text it committed, marked as the core's (§9 Create; §3 scenario 5, Deviation).
INSERT_PENDING_STATE = text(
    """
    INSERT INTO ai.context_ai_state """
    + INSERT_PENDING_STATE_COLUMNS
    + """
    VALUES (:context_id, 'PENDING', 'PENDING', 0, now(), :user_id, :record_id,
            :text_sha256, true)
    """
)

# The cancel (§9 Delete, ``CoreOperation.CANCEL``): every stage CANCELLED whatever its status,
# built from the stage order; the one SET of every statement that cancels (this module's and the
# single-context delete and modify of ``context_writes``).
CANCEL_EVERY_STAGE = (
    "SET "
    + ", ".join(f"{stage.status_column} = '{Status.CANCELLED}'" for stage in STAGE_ORDER)
    + ", updated_at = now()"
)

# Cancel whatever the statuses were (§9 Delete); rows locked in id order first.
CANCEL_STATES = text(
    """
    WITH locked AS (
        SELECT context_id FROM ai.context_ai_state
        WHERE context_id = ANY(CAST(:context_ids AS bigint[]))
        ORDER BY context_id
        FOR UPDATE
    )
    UPDATE ai.context_ai_state AS s
    """
    + CANCEL_EVERY_STAGE
    + """
    FROM locked
    WHERE s.context_id = locked.context_id
    """
)

# The status of the stage that would run next (module docstring): the embedding stage while
# it is unfinished, else the keyword stage once the embedding stage is COMPLETED; NULL else.
NEXT_STAGE_SQL = """
    CASE
        WHEN embedding_status IN ('PENDING', 'PROCESSING') THEN embedding_status
        WHEN embedding_status = 'COMPLETED' THEN keyword_status
    END
"""

# A keyword stage a `reprocess keywords --via batch` marked and still open (0120): the batch
# path's (core_service.repository.keyword_batches), so neither re-requested by the rescan nor
# failed by the finalizer, held by a provider batch or not yet sent; a batch that does not
# finish it clears the mark and it is stale again (docs/contract.md §2 and §9, Deviation
# "batch-held work"). Its retry_count is untouched meanwhile.
_NOT_BATCH_HELD = """
    NOT (keyword_via_batch AND embedding_status = 'COMPLETED'
         AND keyword_status IN ('PENDING', 'PROCESSING'))
"""

# A row whose next stage is stale (module docstring), and not the batch path's; shared by the
# rescan and the finalizer.
_NEXT_STAGE_IS_STALE = (
    "("
    + _NOT_BATCH_HELD
    + """ AND
    ("""
    + NEXT_STAGE_SQL
    + """ = 'PENDING'
     AND greatest(updated_at, coalesce(rescanned_at, updated_at))
         < now() - make_interval(secs => :pending_expiry_seconds)
    OR"""
    + NEXT_STAGE_SQL
    + """ = 'PROCESSING'
     AND greatest(updated_at, coalesce(rescanned_at, updated_at))
         < now() - make_interval(secs => :processing_expiry_seconds)))
"""
)

# A row the rescan may take: stale, or unfinished and let go by a dispatcher whose retry set
# could not keep it (next_dispatch_at due; docs/rescan.md "Backlog").
_NEXT_STAGE_IS_DUE = (
    "("
    + _NEXT_STAGE_IS_STALE
    + " OR (next_dispatch_at <= now() AND "
    + _NOT_BATCH_HELD
    + " AND "
    + NEXT_STAGE_SQL
    + " IN ('PENDING', 'PROCESSING')))"
)

# A row with an unfinished stage: the predicate of the partial indexes on unfinished rows
# (0006, 0014), written out so that the planner can use them.
_UNFINISHED_ROW = """
    (embedding_status IN ('PENDING', 'PROCESSING') OR keyword_status IN ('PENDING', 'PROCESSING'))
"""

# One owner's due rows with retries left, oldest first, numbered (turn); "s" is the state row.
_DUE_OF_OWNER = (
    """
        SELECT s.context_id, s.updated_at AS age,
               row_number() OVER (ORDER BY s.updated_at, s.context_id) AS turn
        FROM ai.context_ai_state AS s
        WHERE {owner} AND """
    + _UNFINISHED_ROW
    + " AND s.retry_count < :max_retry AND "
    + _NEXT_STAGE_IS_DUE
    + """
        ORDER BY s.updated_at, s.context_id
        LIMIT :batch_size
"""
)

# Rescan claim (§9 steps 2-3): due rows with retries left, round robin over owners (user_id;
# rows without one are one owner) and oldest first within an owner (docs/scaling.md
# "Fairness"), skipping rows locked elsewhere; stamp rescanned_at and clear next_dispatch_at;
# updated_at is deliberately untouched. The owners are found by skipping through the owner
# index (0014), and each gives at most :batch_size candidates, so a pass costs owners x batch,
# not the whole backlog. The locking query checks each row again, as it is once locked. The
# claim spends nothing: a retry is spent only when a worker takes the re-request
# (RECORD_ACCEPTED_DISPATCH).
CLAIM_STALE = text(
    """
    WITH RECURSIVE owners (user_id) AS (
        (SELECT user_id FROM ai.context_ai_state
         WHERE user_id IS NOT NULL AND """
    + _UNFINISHED_ROW
    + """
         ORDER BY user_id LIMIT 1)
        UNION ALL
        SELECT (SELECT s.user_id FROM ai.context_ai_state AS s
                WHERE s.user_id > owners.user_id AND """
    + _UNFINISHED_ROW
    + """
                ORDER BY s.user_id LIMIT 1)
        FROM owners WHERE owners.user_id IS NOT NULL
    ),
    candidates AS (
        SELECT due.* FROM owners CROSS JOIN LATERAL ("""
    + _DUE_OF_OWNER.format(owner="s.user_id = owners.user_id")
    + """) AS due
        WHERE owners.user_id IS NOT NULL
        UNION ALL
        ("""
    + _DUE_OF_OWNER.format(owner="s.user_id IS NULL")
    + """)
    ),
    stale AS (
        SELECT context_id FROM ai.context_ai_state
        JOIN candidates USING (context_id)
        WHERE retry_count < :max_retry AND """
    + _NEXT_STAGE_IS_DUE
    + """
        ORDER BY candidates.turn, candidates.age, context_id
        LIMIT :batch_size
        FOR UPDATE OF context_ai_state SKIP LOCKED
    )
    UPDATE ai.context_ai_state AS s
    SET rescanned_at = now(), next_dispatch_at = NULL
    FROM stale
    WHERE s.context_id = stale.context_id
    RETURNING s.context_id, s.retry_count
    """
)

# Rows a dispatcher let go of unsent (docs/rescan.md "Backlog"): each unfinished one becomes
# due for the rescan in :delay_seconds, before its expiry. Locked in id order, like a cancel.
DEFER_DISPATCH = text(
    """
    WITH held AS (
        SELECT context_id FROM ai.context_ai_state
        WHERE context_id = ANY(CAST(:context_ids AS bigint[]))
          AND (embedding_status IN ('PENDING', 'PROCESSING')
               OR keyword_status IN ('PENDING', 'PROCESSING'))
        ORDER BY context_id
        FOR UPDATE
    )
    UPDATE ai.context_ai_state AS s
    SET next_dispatch_at = now() + make_interval(secs => :delay_seconds)
    FROM held
    WHERE s.context_id = held.context_id
    """
)

# After a dispatch a worker took (202, or a timeout after sending; docs/rescan.md "Budget"):
# the context's first is free and stamps dispatch_accepted_at, each later one spends one
# retry, never past the budget. Free too while the context waits for its vector of the
# profile in use (embedding COMPLETED, keyword stage unfinished, no live vector of that
# profile, its backfill row of that profile open): the worker claims nothing then ("vector of
# this profile still coming"), a wait that is not the note's fault. updated_at is untouched
# (the worker's clock). The same statement records the dispatch's time, worker and outcome
# (0096_last_dispatch.sql, read by `pinlog-core inspect`).
RECORD_ACCEPTED_DISPATCH = text(
    """
    UPDATE ai.context_ai_state AS s
    SET retry_count = s.retry_count + CASE
            WHEN s.dispatch_accepted_at IS NULL THEN 0
            WHEN s.embedding_status = 'COMPLETED'
                 AND s.keyword_status IN ('PENDING', 'PROCESSING')
                 AND EXISTS (
                     SELECT 1
                     FROM core.embedding_switch AS w
                     JOIN ai.context_embedding_backfill AS b
                       ON b.embedding_profile = w.profile_in_use
                     WHERE w.id = 1 AND b.context_id = s.context_id
                       AND b.status IN ('PENDING', 'PROCESSING'))
                 AND NOT EXISTS (
                     SELECT 1
                     FROM core.embedding_switch AS w
                     JOIN ai.context_embedding AS e
                       ON e.embedding_profile = w.profile_in_use
                     WHERE w.id = 1 AND e.context_id = s.context_id AND NOT e.is_deleted)
                 THEN 0
            ELSE 1 END,
        dispatch_accepted_at = coalesce(s.dispatch_accepted_at, now()),
        last_dispatch_at = now(),
        last_dispatch_worker = CAST(:worker AS text),
        last_dispatch_outcome = CAST(:outcome AS text)
    WHERE s.context_id = :context_id
      AND (s.dispatch_accepted_at IS NULL OR s.retry_count < :max_retry)
    RETURNING s.retry_count
    """
)

# How many of these rows a worker has taken a dispatch of.
COUNT_TAKEN = text(
    """
    SELECT count(*) FROM ai.context_ai_state
    WHERE context_id = ANY(CAST(:context_ids AS bigint[])) AND dispatch_accepted_at IS NOT NULL
    """
)

# Finalizer (§9 step 1): exhausted stale rows get their unfinished stages FAILED with the
# reason :reason (retries_exhausted), by whitelist, so COMPLETED, FAILED and
# CANCELLED are never overwritten.
FINALIZE_EXHAUSTED = text(
    """
    WITH exhausted AS (
        SELECT context_id FROM ai.context_ai_state
        WHERE retry_count >= :max_retry AND """
    + _NEXT_STAGE_IS_STALE
    + """
        ORDER BY context_id
        LIMIT :batch_size
        FOR UPDATE SKIP LOCKED
    )
    UPDATE ai.context_ai_state AS s
    SET embedding_status = CASE WHEN s.embedding_status IN ('PENDING', 'PROCESSING')
                                THEN 'FAILED' ELSE s.embedding_status END,
        embedding_failure = CASE WHEN s.embedding_status IN ('PENDING', 'PROCESSING')
                                 THEN :reason ELSE s.embedding_failure END,
        keyword_status = CASE WHEN s.keyword_status IN ('PENDING', 'PROCESSING')
                              THEN 'FAILED' ELSE s.keyword_status END,
        keyword_failure = CASE WHEN s.keyword_status IN ('PENDING', 'PROCESSING')
                               THEN :reason ELSE s.keyword_failure END,
        updated_at = now()
    FROM exhausted
    WHERE s.context_id = exhausted.context_id
    RETURNING s.context_id
    """
)

# A keyword stage that can never run (its claim needs embedding COMPLETED, but the embedding
# stage FAILED for good) is closed at once with the reason :reason (embedding_failed) instead
# of being re-requested (docs/rescan.md).
CLOSE_BLOCKED_KEYWORD_STAGES = text(
    """
    WITH blocked AS (
        SELECT context_id FROM ai.context_ai_state
        WHERE embedding_status = 'FAILED' AND keyword_status IN ('PENDING', 'PROCESSING')
        ORDER BY context_id
        LIMIT :batch_size
        FOR UPDATE SKIP LOCKED
    )
    UPDATE ai.context_ai_state AS s
    SET keyword_status = 'FAILED', keyword_failure = :reason, updated_at = now()
    FROM blocked
    WHERE s.context_id = blocked.context_id
    RETURNING s.context_id
    """
)


@dataclass(frozen=True, slots=True)
class Expiries:
    """Seconds after which a ``PENDING`` / ``PROCESSING`` next stage is stale (§9)."""

    pending_seconds: float
    processing_seconds: float

    def as_params(self) -> dict[str, float]:
        return {
            "pending_expiry_seconds": float(self.pending_seconds),
            "processing_expiry_seconds": float(self.processing_seconds),
        }


async def insert_pending(
    conn: AsyncConnection, *, context_id: int, user_id: int, record_id: int, body: str
) -> None:
    """The new context's state row: ``PENDING``/``PENDING``/0 (§9 Create), with the digest of
    ``body`` (the stored text every dispatch sends) that the worker checks requests against."""
    params = {
        "context_id": context_id,
        "user_id": user_id,
        "record_id": record_id,
        "text_sha256": fingerprint(body),
    }
    await conn.execute(INSERT_PENDING_STATE, params)


async def cancel(conn: AsyncConnection, context_ids: Sequence[int]) -> int:
    """Both statuses ``CANCELLED`` for every row among ``context_ids``; rows changed."""
    result = await conn.execute(CANCEL_STATES, {"context_ids": list(context_ids)})
    return result.rowcount


async def claim_stale(
    conn: AsyncConnection, *, expiries: Expiries, max_retry: int, batch_size: int
) -> list[tuple[int, int]]:
    """Claim up to ``batch_size`` stale rows with ``retry_count < max_retry``; nothing spent.

    Returns ``(context_id, retry_count)`` pairs.
    """
    params = {"max_retry": max_retry, "batch_size": batch_size, **expiries.as_params()}
    result = await conn.execute(CLAIM_STALE, params)
    return [(int(row.context_id), int(row.retry_count)) for row in result]


async def defer_dispatch(
    conn: AsyncConnection, context_ids: Sequence[int], *, delay_seconds: float
) -> int:
    """Make the unfinished rows among ``context_ids`` due for the rescan in ``delay_seconds``;
    rows changed."""
    params = {"context_ids": list(context_ids), "delay_seconds": float(delay_seconds)}
    return (await conn.execute(DEFER_DISPATCH, params)).rowcount


async def count_taken(conn: AsyncConnection, context_ids: Sequence[int]) -> int:
    """How many rows among ``context_ids`` a worker has taken a dispatch of."""
    result = await conn.execute(COUNT_TAKEN, {"context_ids": list(context_ids)})
    return int(result.scalar_one())


async def record_accepted_dispatch(
    conn: AsyncConnection,
    *,
    context_id: int,
    max_retry: int,
    worker: str | None = None,
    outcome: str | None = None,
) -> int | None:
    """Count a dispatch a worker took: free the first time, else one retry spent while
    ``retry_count < max_retry``, and record it as the context's last dispatch (``worker``: the
    base URL that took it; ``outcome``: ``accepted``, ``timed_out`` or ``HTTP <status>``). The
    new ``retry_count``; ``None`` when nothing was written (no row, or the budget already
    spent)."""
    params = {
        "context_id": context_id,
        "max_retry": max_retry,
        "worker": worker,
        "outcome": outcome,
    }
    row = (await conn.execute(RECORD_ACCEPTED_DISPATCH, params)).one_or_none()
    return None if row is None else int(row.retry_count)


async def finalize_exhausted(
    conn: AsyncConnection, *, expiries: Expiries, max_retry: int, batch_size: int
) -> list[int]:
    """Fail the unfinished stages of up to ``batch_size`` exhausted stale rows; their ids."""
    params = {
        "max_retry": max_retry,
        "batch_size": batch_size,
        "reason": FailureReason.RETRIES_EXHAUSTED.value,
        **expiries.as_params(),
    }
    return [
        int(context_id) for context_id in (await conn.execute(FINALIZE_EXHAUSTED, params)).scalars()
    ]


async def close_blocked_keyword_stages(conn: AsyncConnection, *, batch_size: int) -> list[int]:
    """Fail up to ``batch_size`` keyword stages whose embedding stage ``FAILED``; their ids."""
    params = {"batch_size": batch_size, "reason": FailureReason.EMBEDDING_FAILED.value}
    result = await conn.execute(CLOSE_BLOCKED_KEYWORD_STAGES, params)
    return [int(context_id) for context_id in result.scalars()]
