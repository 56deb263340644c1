"""``core.member_daily_notes``: the daily note cap, taken by the statement that writes a note.

One row per member: the notes it created on the UTC day ``day``. A note is admitted by one
conditional UPSERT on that row: ``ON CONFLICT DO UPDATE ... WHERE`` locks the row and checks
the newest committed count under the lock (not the statement's snapshot), so concurrent
creates of one member queue on the row and exactly ``cap`` of them pass in a day. The row is
taken after the record's lock and before the new context (docs/lock-order.md); a cap of 0 or
less takes nothing. A note refused by the cap leaves the count unchanged.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

# A CTE `daily_note` that holds one row when member :member_id, with a row in `target`, may create
# one more note today, and has counted it; none when the cap is reached. Takes nothing when
# :daily_notes <= 0 (`note_admitted` below then holds regardless).
DAILY_NOTE_CTE = """
    daily_note AS (
        INSERT INTO core.member_daily_notes AS q (member_id, day, notes)
        SELECT CAST(:member_id AS bigint), CAST(timezone('UTC', now()) AS date), 1
        FROM target WHERE CAST(:daily_notes AS integer) > 0
        ON CONFLICT (member_id) DO UPDATE
        SET day = excluded.day,
            notes = CASE WHEN q.day = excluded.day THEN q.notes + 1 ELSE 1 END
        WHERE q.day <> excluded.day OR q.notes < CAST(:daily_notes AS integer)
        RETURNING q.member_id
    )"""

# The condition, inside a WHERE, under which the new context may be written.
NOTE_ADMITTED = "(CAST(:daily_notes AS integer) <= 0 OR EXISTS (SELECT 1 FROM daily_note))"

# The same admission as a statement of its own (the step-by-step create, after the record).
TAKE_DAILY_NOTE = text(
    "WITH target AS (SELECT 1 AS one),"  # noqa: S608 (constant)
    + DAILY_NOTE_CTE
    + " SELECT EXISTS (SELECT 1 FROM daily_note) AS admitted"
)


async def take(conn: AsyncConnection, *, member_id: int, daily_notes: int) -> bool:
    """Count one more note of ``member_id`` today; False (nothing counted) when
    ``daily_notes`` are counted already. True at once when ``daily_notes`` <= 0 (off)."""
    if daily_notes <= 0:
        return True
    row = await conn.execute(TAKE_DAILY_NOTE, {"member_id": member_id, "daily_notes": daily_notes})
    return bool(row.scalar_one())
