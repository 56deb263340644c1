"""Live contexts with a ``FAILED`` stage, for ``pinlog-core retry-failed`` (docs/operations.md).

A context's reason is its first ``FAILED`` stage's in ``STAGE_ORDER`` (the embedding stage's
before the keyword stage's, as the record read shows it), ``unknown`` when the column is
empty. Stage columns come from ``STAGE_ORDER`` and ``FAILURE_COLUMNS``, once, at import.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from pinlog_platform.contract.states import STAGE_ORDER
from pinlog_platform.contract.states.failure_reasons import FAILURE_COLUMNS, FailureReason

_REASON = (
    "CASE "
    + " ".join(
        f"WHEN s.{stage.status_column} = 'FAILED' "
        f"THEN coalesce(s.{FAILURE_COLUMNS[stage.status_column]}, CAST(:unknown AS text))"
        for stage in STAGE_ORDER
    )
    + " END"
)
_ANY_FAILED = " OR ".join(f"s.{stage.status_column} = 'FAILED'" for stage in STAGE_ORDER)

# Live contexts (not deleted, active record, active member) with a FAILED stage, filtered by
# reason (one named, or any but :skipped_reasons), owner and age of the failure, oldest id
# first, at most :limit.
SELECT_FAILED = text(
    "".join(
        (
            """
    SELECT c.id AS context_id, c.record_id, c.member_id, f.reason
    FROM core.context AS c
    JOIN core.record AS r ON r.id = c.record_id AND r.deleted_at IS NULL
    JOIN core.member AS m ON m.id = c.member_id AND m.deleted_at IS NULL
    JOIN ai.context_ai_state AS s ON s.context_id = c.id
    CROSS JOIN LATERAL (SELECT """,
            _REASON,
            """ AS reason) AS f
    WHERE c.deleted_at IS NULL AND (""",
            _ANY_FAILED,
            """)
      AND (CAST(:reason AS text) IS NULL AND f.reason <> ALL(CAST(:skipped_reasons AS text[]))
           OR f.reason = CAST(:reason AS text))
      AND (CAST(:member_id AS bigint) IS NULL OR c.member_id = CAST(:member_id AS bigint))
      AND (CAST(:since_seconds AS float8) IS NULL
           OR s.updated_at > now() - make_interval(secs => CAST(:since_seconds AS float8)))
    ORDER BY c.id
    LIMIT :limit
    """,
        )
    )
)

# Lock a context's state row (after the context: docs/lock-order.md) and say whether a stage
# is still FAILED; no row, no answer.
LOCK_FAILED = text(
    "".join(
        (
            "SELECT (",
            _ANY_FAILED,
            ") AS failed FROM ai.context_ai_state AS s WHERE s.context_id = :context_id",
            " FOR UPDATE",
        )
    )
)


@dataclass(frozen=True, slots=True)
class FailedContext:
    context_id: int
    record_id: int
    member_id: int
    reason: str


async def select(
    conn: AsyncConnection,
    *,
    reason: str | None,
    skipped_reasons: Sequence[str],
    member_id: int | None,
    since_seconds: float | None,
    limit: int,
) -> list[FailedContext]:
    """Up to ``limit`` live contexts with a ``FAILED`` stage (module docstring)."""
    params = {
        "reason": reason,
        "skipped_reasons": list(skipped_reasons),
        "member_id": member_id,
        "since_seconds": since_seconds,
        "limit": limit,
        "unknown": FailureReason.UNKNOWN.value,
    }
    rows = await conn.execute(SELECT_FAILED, params)
    return [FailedContext(r.context_id, r.record_id, r.member_id, r.reason) for r in rows]


async def lock_still_failed(conn: AsyncConnection, context_id: int) -> bool:
    """``FOR UPDATE`` the context's state row; whether a stage is still ``FAILED``."""
    row = (await conn.execute(LOCK_FAILED, {"context_id": context_id})).one_or_none()
    return row is not None and bool(row.failed)
