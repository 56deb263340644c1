"""``core.member``: members exist once created by ``pinlog-core token``; withdrawal is soft."""

from __future__ import annotations

from enum import StrEnum

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

# Create the member with this id unless it exists (explicit ids: tokens name them).
INSERT_MEMBER = text("INSERT INTO core.member (id) VALUES (:member_id) ON CONFLICT (id) DO NOTHING")

# Whether the member exists and is active; no lock (token checks on every request).
READ_MEMBER = text("SELECT deleted_at IS NULL AS active FROM core.member WHERE id = :member_id")

# Share-lock an active member for a create: a concurrent withdrawal waits or is seen.
LOCK_ACTIVE_MEMBER = text(
    "SELECT id FROM core.member WHERE id = :member_id AND deleted_at IS NULL FOR SHARE"
)

# Withdraw: the first lock of the withdrawal (member before record, docs/lock-order.md).
WITHDRAW_MEMBER = text(
    "UPDATE core.member SET deleted_at = now() "
    "WHERE id = :member_id AND deleted_at IS NULL RETURNING id"
)


class MemberState(StrEnum):
    ACTIVE = "ACTIVE"
    WITHDRAWN = "WITHDRAWN"
    UNKNOWN = "UNKNOWN"


async def ensure(conn: AsyncConnection, member_id: int) -> MemberState:
    """Create member ``member_id`` if absent; return its state afterwards."""
    await conn.execute(INSERT_MEMBER, {"member_id": member_id})
    return await state(conn, member_id)


async def state(conn: AsyncConnection, member_id: int) -> MemberState:
    """``ACTIVE``, ``WITHDRAWN`` or ``UNKNOWN`` (never created), without locking."""
    active = (await conn.execute(READ_MEMBER, {"member_id": member_id})).scalar_one_or_none()
    if active is None:
        return MemberState.UNKNOWN
    return MemberState.ACTIVE if active else MemberState.WITHDRAWN


async def lock_active(conn: AsyncConnection, member_id: int) -> bool:
    """``FOR SHARE`` the member; False when it does not exist or has withdrawn."""
    row = (await conn.execute(LOCK_ACTIVE_MEMBER, {"member_id": member_id})).one_or_none()
    return row is not None


async def withdraw(conn: AsyncConnection, member_id: int) -> bool:
    """Soft-delete the member; False when it was not active."""
    row = (await conn.execute(WITHDRAW_MEMBER, {"member_id": member_id})).one_or_none()
    return row is not None
