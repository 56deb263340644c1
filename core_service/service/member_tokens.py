"""Member bearer tokens: HS256 JWTs (PyJWT) whose ``sub`` is the member id, with rotating keys.

A token is accepted only while it is well-signed, unexpired, claims no longer a lifetime than
the cap, names this service as issuer and audience, and its member is active (a withdrawn
member's tokens stop working at once).

Keys rotate without logging anyone out (docs/operations.md "Signing keys"): every token carries
``kid``, derived from the key that signed it (``key_id``), so replicas agree on which key is
which without configuration; the core signs with the current key and verifies against the
current and the previous keys. Clocks of replicas may differ by seconds: ``CLOCK_LEEWAY_SECONDS``.

A token without ``kid`` (the format before key rotation) verifies against the current key only, and
only while the database clock is before the moment this database switched format
(``core.token_format.upgraded_at``, 0021) plus the lifetime cap: by then every such token a
replica could have issued has expired or claims more than the cap.

Verification is cached: a token whose signature, ``kid``, issuer, audience, lifetime cap and
canonical ``sub`` passed is remembered by its exact string (``VERIFIED_TOKENS_HELD`` at most,
the least recently used dropped first) until ``exp`` plus ``CLOCK_LEEWAY_SECONDS``, the moment
the verification itself would start refusing it; none of those checks can turn from pass to
refuse before then. A refused token is never remembered. What can change at any moment is
checked on every request by ``member_id``: the member's state (a withdrawal refuses the
member's tokens at once, on every replica) and, for a token without ``kid``, the database's
say on the old format. Keys are settings, so a key removed from the configuration leaves with
a restart, and the cache with it: no remembered token outlives the key that verified it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import jwt
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.errors import UNAUTHENTICATED_DETAIL, UnauthenticatedError
from core_service.repository import member
from core_service.repository.db import client_autocommit
from core_service.repository.member import MemberState
from pinlog_platform.contract.canonical_ids import parse_canonical_id

ALGORITHM = "HS256"
ISSUER = "pinlog-core"
AUDIENCE = "pinlog-client-api"
KID_CHARACTERS = 8
# Replicas' clocks differ by seconds: iat in the future and exp in the past are forgiven this.
CLOCK_LEEWAY_SECONDS = 60
# Verified tokens one process remembers (a few hundred bytes each).
VERIFIED_TOKENS_HELD = 10_000
_REFUSED = UNAUTHENTICATED_DETAIL

# Whether a token without kid may still be accepted (module docstring), by the database clock.
LEGACY_TOKENS_ACCEPTED = text(
    "SELECT now() < upgraded_at + make_interval(secs => :cap_seconds) FROM core.token_format"
)


def key_id(secret: str) -> str:
    """The ``kid`` of a signing key: base64url of its SHA-256, first 8 characters. Public: it
    reveals nothing usable about the key, and every replica derives the same one."""
    digest = hashlib.sha256(secret.encode("utf-8")).digest()
    return base64.urlsafe_b64encode(digest).decode("ascii")[:KID_CHARACTERS]


def issue_token(member_id: int, *, secret: str, ttl_seconds: int) -> str:
    """A token for ``member_id`` signed with ``secret`` (the current key), valid for
    ``ttl_seconds`` seconds, with ``kid``, ``iss`` and ``aud``."""
    now = int(time.time())
    claims = {
        "sub": str(member_id),
        "iat": now,
        "exp": now + ttl_seconds,
        "iss": ISSUER,
        "aud": AUDIENCE,
    }
    return jwt.encode(claims, secret, algorithm=ALGORITHM, headers={"kid": key_id(secret)})


@dataclass(frozen=True, slots=True)
class SigningKeys:
    """The current key (signs and verifies) and previous keys (verify only), by ``kid``."""

    current: str
    previous: tuple[str, ...] = ()

    def by_kid(self, kid: str) -> str | None:
        """The key whose ``key_id`` is ``kid``; ``None`` when no configured key has it."""
        for secret in (self.current, *self.previous):
            if hmac.compare_digest(key_id(secret), kid):
                return secret
        return None


@dataclass(frozen=True, slots=True)
class VerifiedToken:
    """What a token proved: its member, whether it is of the format without ``kid``, and the
    moment (seconds since the epoch) from which its verification refuses it."""

    member_id: int
    legacy_format: bool
    refused_from: float


class VerifiedTokens:
    """Verified tokens by their exact string, at most ``capacity``, least recently used
    dropped first; an entry is dropped when read at or after its ``refused_from``."""

    def __init__(self, capacity: int = VERIFIED_TOKENS_HELD) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[str, VerifiedToken] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, token: str, now: float) -> VerifiedToken | None:
        entry = self._entries.get(token)
        if entry is None:
            return None
        if now >= entry.refused_from:
            del self._entries[token]
            return None
        self._entries.move_to_end(token)
        return entry

    def put(self, token: str, entry: VerifiedToken) -> None:
        self._entries[token] = entry
        self._entries.move_to_end(token)
        if len(self._entries) > self._capacity:
            self._entries.popitem(last=False)


class TokenAuthenticator:
    """Checks bearer tokens (module docstring); ``max_lifetime_seconds`` is the cap on
    ``exp - now`` a token may claim."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        secret: str,
        previous_secrets: Sequence[str] = (),
        max_lifetime_seconds: int = 7 * 24 * 3600,
    ) -> None:
        self._engine = engine
        self._keys = SigningKeys(secret, tuple(previous_secrets))
        self._max_lifetime_seconds = max_lifetime_seconds
        self._verified = VerifiedTokens()

    @property
    def tokens_held(self) -> int:
        """How many verified tokens are remembered now (module docstring)."""
        return len(self._verified)

    async def member_id(self, token: str) -> int:
        """The active member a token names. Raises ``UnauthenticatedError`` (401) for a bad
        signature, an unknown ``kid``, a missing, expired or non-numeric claim, a lifetime over
        the cap, another issuer or audience, a non-canonical ``sub``, a format without ``kid``
        past its time, or a member that is unknown or withdrawn. Every refusal has the same
        message. One statement per call (two for a token without ``kid``)."""
        verified = self._verify(token)
        async with client_autocommit(self._engine) as conn:
            if verified.legacy_format and not await self._legacy_accepted(conn):
                raise UnauthenticatedError(_REFUSED)
            if await member.state(conn, verified.member_id) is not MemberState.ACTIVE:
                raise UnauthenticatedError(_REFUSED)
        return verified.member_id

    def verified_member_id(self, token: str) -> int:
        """The member a well-signed, unexpired token names, without the database: for a caller
        whose own statement checks that the member is active. The refusals of ``member_id``
        but the member's state; a token without ``kid`` is refused here (only the database can
        accept that format)."""
        verified = self._verify(token)
        if verified.legacy_format:
            raise UnauthenticatedError(_REFUSED)
        return verified.member_id

    def _verify(self, token: str) -> VerifiedToken:
        now = time.time()
        known = self._verified.get(token, now)
        if known is not None:
            return known
        try:
            kid = jwt.get_unverified_header(token).get("kid")
            claims = self._decode(token, kid)
        except (jwt.PyJWTError, ValueError, TypeError) as exc:
            raise UnauthenticatedError(_REFUSED) from exc
        member_id = parse_canonical_id(claims["sub"])
        if member_id is None or not self._within_cap(claims, now):
            raise UnauthenticatedError(_REFUSED)
        # PyJWT refuses once int(exp) <= now - leeway: the cache ends at the same moment.
        refused_from = int(claims["exp"]) + CLOCK_LEEWAY_SECONDS
        verified = VerifiedToken(member_id, kid is None, refused_from)
        self._verified.put(token, verified)
        return verified

    def _decode(self, token: str, kid: object) -> dict:
        if kid is None:
            # The format before key rotation: the current key only, no iss/aud to check.
            return jwt.decode(
                token,
                self._keys.current,
                algorithms=[ALGORITHM],
                leeway=CLOCK_LEEWAY_SECONDS,
                options={"require": ["sub", "exp", "iat"], "verify_aud": False},
            )
        if not isinstance(kid, str) or (secret := self._keys.by_kid(kid)) is None:
            raise jwt.InvalidKeyError("unknown kid")
        return jwt.decode(
            token,
            secret,
            algorithms=[ALGORITHM],
            issuer=ISSUER,
            audience=AUDIENCE,
            leeway=CLOCK_LEEWAY_SECONDS,
            options={"require": ["sub", "exp", "iat", "iss", "aud"]},
        )

    def _within_cap(self, claims: dict, now: float) -> bool:
        """``exp`` (an integer: PyJWT refused anything else) at most the cap from ``now``."""
        exp = claims["exp"]
        if isinstance(exp, bool) or not isinstance(exp, int | float):
            return False
        return exp - now <= self._max_lifetime_seconds + CLOCK_LEEWAY_SECONDS

    async def _legacy_accepted(self, conn) -> bool:
        params = {"cap_seconds": float(self._max_lifetime_seconds)}
        return bool((await conn.execute(LEGACY_TOKENS_ACCEPTED, params)).scalar_one_or_none())
