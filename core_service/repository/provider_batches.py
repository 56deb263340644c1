"""What the core reads and asks of the provider batches the workers submitted
(``ai.provider_batch``, 0115; docs/operations.md "Backfill via the Batch API"). The core never
calls a provider (§0): it counts the batches (``embed`` for a backfill, ``keyword`` for a
reprocess), finds the first one a ``reembed start`` or ``reprocess keywords --via batch`` waited
for, and asks the workers to cancel an abandoned profile's open batches
(``cancel_requested``). Each statement runs alone (autocommit); none locks a state row.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

# The provider's batch status of a batch that ended well (not a stage status).
NON_STATUS_LITERALS = frozenset({"completed"})

# Batches of :kind (embed, keyword; every kind when NULL) of :profile (every profile when
# NULL): submitted, open (in_progress: not settled),
# settled completed, settled otherwise (failed, expired, cancelled), and the rows the open
# ones hold (items).
BATCH_COUNTS = text(
    """
    SELECT count(*) AS submitted,
           count(*) FILTER (WHERE NOT settled) AS in_progress,
           count(*) FILTER (WHERE settled AND status = 'completed') AS completed,
           count(*) FILTER (WHERE settled AND status <> 'completed') AS failed,
           coalesce(sum(items) FILTER (WHERE NOT settled), 0) AS items
    FROM ai.provider_batch
    WHERE (CAST(:profile AS varchar) IS NULL OR embedding_profile = CAST(:profile AS varchar))
      AND (CAST(:kind AS varchar) IS NULL OR kind = CAST(:kind AS varchar))
    """
)

# The first batch of :kind of :profile submitted at or after :since (the database's clock).
FIRST_BATCH_SINCE = text(
    """
    SELECT batch_id FROM ai.provider_batch
    WHERE embedding_profile = :profile AND kind = :kind AND submitted_at >= :since
    ORDER BY submitted_at, batch_id
    LIMIT 1
    """
)

# Ask the workers to cancel every unsettled batch of profiles other than :keep (NULL: of
# :profile only); how many were asked.
REQUEST_CANCEL = text(
    """
    UPDATE ai.provider_batch
    SET cancel_requested = true
    WHERE NOT settled AND NOT cancel_requested
      AND (embedding_profile = CAST(:profile AS varchar)
           OR (CAST(:keep AS varchar) IS NOT NULL
               AND embedding_profile <> CAST(:keep AS varchar)))
    """
)

# Now, on the database's clock (what FIRST_BATCH_SINCE compares with).
NOW = text("SELECT now() AS now")


@dataclass(frozen=True, slots=True)
class BatchCounts:
    """``submitted`` batches, ``in_progress`` (not yet settled), ``completed``, ``failed``
    (failed, expired or cancelled), and ``items``: rows the open ones hold."""

    submitted: int
    in_progress: int
    completed: int
    failed: int
    items: int

    def as_json(self) -> dict[str, int]:
        return {
            "submitted": self.submitted,
            "in_progress": self.in_progress,
            "completed": self.completed,
            "failed": self.failed,
            "items": self.items,
        }


async def counts(
    conn: AsyncConnection, *, profile: str | None, kind: str | None = None
) -> BatchCounts:
    """The batches of ``kind`` (``embed``, ``keyword``; ``None``: both) of ``profile``
    (``None``: every profile) by state (``BATCH_COUNTS``)."""
    row = (await conn.execute(BATCH_COUNTS, {"profile": profile, "kind": kind})).one()
    return BatchCounts(
        int(row.submitted), int(row.in_progress), int(row.completed), int(row.failed),
        int(row.items),
    )  # fmt: skip


async def now(conn: AsyncConnection) -> datetime:
    """The database's clock."""
    return (await conn.execute(NOW)).scalar_one()


async def first_since(
    conn: AsyncConnection, *, profile: str, since: datetime, kind: str = "embed"
) -> str | None:
    """The id of the first batch of ``kind`` of ``profile`` submitted since ``since``, if
    any."""
    params = {"profile": profile, "since": since, "kind": kind}
    return (await conn.execute(FIRST_BATCH_SINCE, params)).scalar_one_or_none()


async def request_cancel(
    conn: AsyncConnection, *, profile: str | None = None, keep: str | None = None
) -> int:
    """Ask the workers to cancel the unsettled batches of ``profile``, or of every profile
    but ``keep`` (``REQUEST_CANCEL``); how many."""
    return (await conn.execute(REQUEST_CANCEL, {"profile": profile, "keep": keep})).rowcount
