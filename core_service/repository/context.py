"""``core.context``: immutable note bodies; an edit is a new row (§0 principle 1, §9).

There is no statement that changes ``body``: bodies are written once by ``insert``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Row, text
from sqlalchemy.ext.asyncio import AsyncConnection

from core_service.repository.context_search import PURGED_SEARCH_TERMS
from pinlog_platform.contract.states import STAGE_ORDER, Stage, Status

# The columns a new context is written with (here and in ``context_writes``).
INSERT_CONTEXT_COLUMNS = "(record_id, member_id, body, origin_created_at)"

# A new context; origin_created_at is carried over by an edit, else now().
INSERT_CONTEXT = text(
    """
    INSERT INTO core.context """  # noqa: S608 (constant fragments)
    + INSERT_CONTEXT_COLUMNS
    + """
    VALUES (:record_id, :member_id, :body, coalesce(CAST(:origin_created_at AS timestamptz), now()))
    RETURNING id
    """
)

# Lock a context for a modify or a delete, after its record (docs/lock-order.md).
LOCK_CONTEXT = text(
    """
    SELECT body, origin_created_at, deleted_at IS NOT NULL AS deleted, replaced_by
    FROM core.context WHERE id = :context_id
    FOR UPDATE
    """
)

# The context (locked and deleted by this transaction) that replaces a failed one.
MARK_REPLACED = text("UPDATE core.context SET replaced_by = :new_id WHERE id = :context_id")

# Lock the active contexts of some records, in id order, and return their ids.
LOCK_ACTIVE_IN_RECORDS = text(
    """
    SELECT id FROM core.context
    WHERE record_id = ANY(CAST(:record_ids AS bigint[])) AND deleted_at IS NULL
    ORDER BY id
    FOR UPDATE
    """
)

# Soft-delete contexts (already locked by this transaction) and purge their search terms in
# the same statement (context_search.PURGED_SEARCH_TERMS): a record delete, a withdrawal,
# `retry-failed`'s replaced contexts.
SOFT_DELETE_CONTEXTS = text(
    """
    WITH deleted AS (
        UPDATE core.context SET deleted_at = now()
        WHERE id = ANY(CAST(:context_ids AS bigint[])) AND deleted_at IS NULL
        RETURNING id
    ),"""  # noqa: S608 (a constant fragment)
    + PURGED_SEARCH_TERMS
    + """
    SELECT count(*) FROM deleted
    """
)

# What a dispatch sends, plus every stage's status, for contexts picked by the rescan (§9 step 5).
LOAD_FOR_DISPATCH = text(
    """
    SELECT c.id AS context_id, c.member_id, c.record_id, c.body,
           c.deleted_at IS NOT NULL AS deleted,
           p.external_place_id, coalesce(r.place_name, p.name) AS place_name,
           s.embedding_status, s.keyword_status
    FROM core.context AS c
    JOIN core.record AS r ON r.id = c.record_id
    JOIN core.place AS p ON p.id = r.place_id
    LEFT JOIN ai.context_ai_state AS s ON s.context_id = c.id
    WHERE c.id = ANY(CAST(:context_ids AS bigint[]))
    ORDER BY c.id
    """
)


@dataclass(frozen=True, slots=True)
class LockedContext:
    body: str
    origin_created_at: datetime
    deleted: bool
    replaced_by: int | None = None


@dataclass(frozen=True, slots=True)
class DispatchSource:
    """A context as the rescan re-reads it; ``statuses`` holds every stage's status in
    ``STAGE_ORDER``, ``None`` without a state row (§2)."""

    context_id: int
    member_id: int
    record_id: int
    body: str
    deleted: bool
    external_place_id: str
    place_name: str
    statuses: Mapping[Stage, Status] | None


async def insert(
    conn: AsyncConnection,
    *,
    record_id: int,
    member_id: int,
    body: str,
    origin_created_at: datetime | None = None,
) -> int:
    """Insert a context with an already normalised ``body``; return its new id."""
    params = {
        "record_id": record_id,
        "member_id": member_id,
        "body": body,
        "origin_created_at": origin_created_at,
    }
    return int((await conn.execute(INSERT_CONTEXT, params)).scalar_one())


async def lock(conn: AsyncConnection, context_id: int) -> LockedContext:
    """``FOR UPDATE`` an existing context and read its body (contexts are never removed)."""
    row = (await conn.execute(LOCK_CONTEXT, {"context_id": context_id})).one()
    return LockedContext(row.body, row.origin_created_at, row.deleted, row.replaced_by)


async def mark_replaced(conn: AsyncConnection, *, context_id: int, new_id: int) -> None:
    """Name the context that replaced ``context_id`` (a 409 for the old id says it)."""
    await conn.execute(MARK_REPLACED, {"context_id": context_id, "new_id": new_id})


async def lock_active_in_records(conn: AsyncConnection, record_ids: Sequence[int]) -> list[int]:
    """Lock and return the ids of the active contexts of ``record_ids``, in id order."""
    result = await conn.execute(LOCK_ACTIVE_IN_RECORDS, {"record_ids": list(record_ids)})
    return [int(context_id) for context_id in result.scalars()]


async def soft_delete(conn: AsyncConnection, context_ids: Sequence[int]) -> int:
    """Set ``deleted_at`` on still-active contexts among ``context_ids`` and purge their
    search terms; rows changed."""
    result = await conn.execute(SOFT_DELETE_CONTEXTS, {"context_ids": list(context_ids)})
    return int(result.scalar_one())


async def load_for_dispatch(
    conn: AsyncConnection, context_ids: Sequence[int]
) -> list[DispatchSource]:
    """The contexts among ``context_ids`` that exist in core, with their AI statuses."""
    result = await conn.execute(LOAD_FOR_DISPATCH, {"context_ids": list(context_ids)})
    return [
        DispatchSource(
            context_id=row.context_id,
            member_id=row.member_id,
            record_id=row.record_id,
            body=row.body,
            deleted=row.deleted,
            external_place_id=row.external_place_id,
            place_name=row.place_name,
            statuses=_statuses(row),
        )
        for row in result
    ]


def _statuses(row: Row) -> dict[Stage, Status] | None:
    columns = row._mapping
    if columns[STAGE_ORDER[0].status_column] is None:  # LEFT JOIN: no state row
        return None
    return {stage: Status(columns[stage.status_column]) for stage in STAGE_ORDER}
