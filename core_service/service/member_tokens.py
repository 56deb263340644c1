"""Member bearer tokens: HS256 JWTs (PyJWT) whose ``sub`` is the member id.

A token is accepted only while it is well-signed, unexpired and its member is active, so a
withdrawn member's tokens stop working at once.
"""

from __future__ import annotations

import time

import jwt
from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.errors import UnauthenticatedError
from core_service.repository import member
from core_service.repository.db import autocommit
from core_service.repository.member import MemberState

ALGORITHM = "HS256"


def issue_token(member_id: int, *, secret: str, ttl_seconds: int) -> str:
    """A signed token for ``member_id`` valid for ``ttl_seconds`` seconds."""
    now = int(time.time())
    claims = {"sub": str(member_id), "iat": now, "exp": now + ttl_seconds}
    return jwt.encode(claims, secret, algorithm=ALGORITHM)


class TokenAuthenticator:
    def __init__(self, engine: AsyncEngine, *, secret: str) -> None:
        self._engine = engine
        self._secret = secret

    async def member_id(self, token: str) -> int:
        """The active member a token names. Raises ``UnauthenticatedError`` (401) for a bad
        signature, a missing or expired claim, or a member that is unknown or withdrawn."""
        try:
            claims = jwt.decode(
                token,
                self._secret,
                algorithms=[ALGORITHM],
                options={"require": ["sub", "exp", "iat"]},
            )
            member_id = int(claims["sub"])
        except (jwt.PyJWTError, ValueError, TypeError) as exc:
            raise UnauthenticatedError("invalid or expired token") from exc
        if not 0 < member_id < 2**63:
            raise UnauthenticatedError("invalid or expired token")
        async with autocommit(self._engine) as conn:
            if await member.state(conn, member_id) is not MemberState.ACTIVE:
                raise UnauthenticatedError("invalid or expired token")
        return member_id
