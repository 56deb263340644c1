"""``core.place``: one row per external place id; the first name given is kept."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

# Insert the place unless its external id exists; RETURNING is empty on conflict.
INSERT_PLACE = text(
    "INSERT INTO core.place (external_place_id, name) VALUES (:external_place_id, :name) "
    "ON CONFLICT (external_place_id) DO NOTHING RETURNING id, name"
)

# The place by external id (after a conflicting insert committed elsewhere).
FIND_PLACE = text("SELECT id, name FROM core.place WHERE external_place_id = :external_place_id")


@dataclass(frozen=True, slots=True)
class StoredPlace:
    """A place as stored: the first name given for its external id is kept."""

    place_id: int
    name: str


async def get_or_create(conn: AsyncConnection, *, external_place_id: str, name: str) -> StoredPlace:
    """The place, created with ``name`` if new; safe under concurrent creates of one place.

    ``ON CONFLICT DO NOTHING`` waits for a concurrent inserter to commit, and the following
    statement's new snapshot (READ COMMITTED) sees its row.
    """
    params = {"external_place_id": external_place_id, "name": name}
    row = (await conn.execute(INSERT_PLACE, params)).one_or_none()
    if row is None:
        row = (await conn.execute(FIND_PLACE, params)).one()
    return StoredPlace(int(row.id), row.name)
