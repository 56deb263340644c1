"""``ai.context_text_fingerprint``: what the first request said about each context (§3).

Lets the worker notice, across restarts, a caller that sends one ``context_id`` with another
text (scenario 5) or another owner. The first request stays the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

# Record the first request's facts; on later sight compare with them.
RECORD_FINGERPRINT = text(
    """
    INSERT INTO ai.context_text_fingerprint (context_id, user_id, record_id, text_sha256)
    VALUES (:context_id, :user_id, :record_id, :text_sha256)
    ON CONFLICT (context_id) DO UPDATE SET last_seen_at = now()
    RETURNING text_sha256 = :text_sha256 AS same_text,
              (user_id = :user_id AND record_id = :record_id) AS same_owner
    """
)


@dataclass(frozen=True, slots=True)
class FingerprintMatch:
    """Whether this request agrees with the first one seen for its context."""

    same_text: bool
    same_owner: bool


async def record(
    conn: AsyncConnection, *, context_id: int, user_id: int, record_id: int, text_sha256: bytes
) -> FingerprintMatch:
    """Store the first request's facts or compare with them; ``text_sha256`` is 32 bytes."""
    row = (
        await conn.execute(
            RECORD_FINGERPRINT,
            {
                "context_id": context_id,
                "user_id": user_id,
                "record_id": record_id,
                "text_sha256": text_sha256,
            },
        )
    ).one()
    return FingerprintMatch(same_text=bool(row.same_text), same_owner=bool(row.same_owner))
