"""``core.place``: one row per external place id; the first name given is kept."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

# Insert the place unless its external id exists; RETURNING is empty on conflict.
INSERT_PLACE = text(
    "INSERT INTO core.place (external_place_id, name) VALUES (:external_place_id, :name) "
    "ON CONFLICT (external_place_id) DO NOTHING RETURNING id"
)

# The place's id by external id (after a conflicting insert committed elsewhere).
FIND_PLACE = text("SELECT id FROM core.place WHERE external_place_id = :external_place_id")


async def get_or_create(conn: AsyncConnection, *, external_place_id: str, name: str) -> int:
    """The id of the place, creating it; safe under concurrent creates of one place.

    ``ON CONFLICT DO NOTHING`` waits for a concurrent inserter to commit, and the following
    statement's new snapshot (READ COMMITTED) sees its row.
    """
    params = {"external_place_id": external_place_id, "name": name}
    created = (await conn.execute(INSERT_PLACE, params)).scalar_one_or_none()
    if created is not None:
        return int(created)
    return int((await conn.execute(FIND_PLACE, params)).scalar_one())
