"""``core.record``: a member's saved place; at most one active per member and place (§1).

Locks: every statement that changes one record takes its row lock first in its transaction
after the member (docs/lock-order.md); ``touch_active`` doubles as the lock and the
ownership check of per-record operations.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

# Create the member's active record for a place, with the place name this member gave,
# unless one exists (partial unique index).
INSERT_RECORD = text(
    """
    INSERT INTO core.record (member_id, place_id, place_name)
    VALUES (:member_id, :place_id, :place_name)
    ON CONFLICT (member_id, place_id) WHERE deleted_at IS NULL DO NOTHING
    RETURNING id, public_id
    """
)

# Lock the member's active record for a place (it exists: the insert above conflicted); its
# id and the name its owner gave (the place's own for a row written before 0024).
TOUCH_ACTIVE_RECORD_OF_PLACE = text(
    """
    UPDATE core.record AS r SET updated_at = now()
    FROM core.place AS p
    WHERE r.member_id = :member_id AND r.place_id = :place_id AND r.deleted_at IS NULL
      AND p.id = r.place_id
    RETURNING r.id, r.public_id, coalesce(r.place_name, p.name) AS name
    """
)

# Lock one active record of this member (per-record operations; also the ownership check)
# and return its place for the dispatch, with the name the owner gave; the place row itself
# is not locked.
TOUCH_ACTIVE_RECORD = text(
    """
    UPDATE core.record AS r SET updated_at = now()
    FROM core.place AS p
    WHERE r.id = :record_id AND r.member_id = :member_id AND r.deleted_at IS NULL
      AND p.id = r.place_id
    RETURNING p.external_place_id, coalesce(r.place_name, p.name) AS name
    """
)

# Soft-delete one active record of this member; its row lock comes first in the deletion.
DELETE_RECORD = text(
    """
    UPDATE core.record SET deleted_at = now(), updated_at = now()
    WHERE id = :record_id AND member_id = :member_id AND deleted_at IS NULL
    RETURNING id
    """
)

# Soft-delete every active record of a member (withdrawal, after the member's lock).
DELETE_MEMBER_RECORDS = text(
    """
    UPDATE core.record SET deleted_at = now(), updated_at = now()
    WHERE member_id = :member_id AND deleted_at IS NULL
    RETURNING id
    """
)


@dataclass(frozen=True, slots=True)
class OwnRecord:
    record_id: int
    place_name: str
    public_id: str


async def insert_if_absent(
    conn: AsyncConnection, *, member_id: int, place_id: int, place_name: str
) -> OwnRecord | None:
    """The new record (its public id the column's default), or ``None`` when the member
    already has one for the place. ``place_name``: the name this member gave, the one the
    record shows."""
    params = {"member_id": member_id, "place_id": place_id, "place_name": place_name}
    created = (await conn.execute(INSERT_RECORD, params)).one_or_none()
    return None if created is None else OwnRecord(int(created.id), place_name, created.public_id)


async def touch_active_of_place(
    conn: AsyncConnection, *, member_id: int, place_id: int
) -> OwnRecord | None:
    """Lock the member's active record for the place: its id and the place name its owner
    gave; ``None`` if it was deleted meanwhile."""
    params = {"member_id": member_id, "place_id": place_id}
    row = (await conn.execute(TOUCH_ACTIVE_RECORD_OF_PLACE, params)).one_or_none()
    return None if row is None else OwnRecord(int(row.id), row.name, row.public_id)


@dataclass(frozen=True, slots=True)
class Place:
    external_place_id: str
    name: str


async def touch_active(conn: AsyncConnection, *, record_id: int, member_id: int) -> Place | None:
    """Lock an active record of ``member_id``; its place, or ``None``: missing, deleted or
    another member's."""
    params = {"record_id": record_id, "member_id": member_id}
    row = (await conn.execute(TOUCH_ACTIVE_RECORD, params)).one_or_none()
    return None if row is None else Place(row.external_place_id, row.name)


async def delete(conn: AsyncConnection, *, record_id: int, member_id: int) -> bool:
    """Soft-delete an active record of ``member_id``; False: missing, deleted or another's."""
    params = {"record_id": record_id, "member_id": member_id}
    return (await conn.execute(DELETE_RECORD, params)).one_or_none() is not None


async def delete_all_of_member(conn: AsyncConnection, member_id: int) -> list[int]:
    """Soft-delete every active record of the member; return their ids."""
    result = await conn.execute(DELETE_MEMBER_RECORDS, {"member_id": member_id})
    return [int(record_id) for record_id in result.scalars()]
