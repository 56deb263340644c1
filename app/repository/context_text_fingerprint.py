"""``ai.context_text_fingerprint``: SHA-256 of the first text seen per context (§3, scenario 5).

Lets the worker notice, across restarts, a caller that sends one ``context_id`` with two texts.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

# Record the digest on first sight; on later sight say whether it matches the first one.
RECORD_FINGERPRINT = text(
    """
    INSERT INTO ai.context_text_fingerprint (context_id, text_sha256)
    VALUES (:context_id, :text_sha256)
    ON CONFLICT (context_id) DO UPDATE SET last_seen_at = now()
    RETURNING text_sha256 = :text_sha256 AS same_text
    """
)


async def record(conn: AsyncConnection, *, context_id: int, text_sha256: bytes) -> bool:
    """Store or compare the 32-byte digest; returns ``False`` when an earlier text differed."""
    result = await conn.execute(
        RECORD_FINGERPRINT, {"context_id": context_id, "text_sha256": text_sha256}
    )
    return bool(result.scalar_one())
