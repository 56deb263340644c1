"""Verified tokens are remembered, the member is not (``core_service/service/member_tokens.py``):
a remembered token is refused as soon as its member withdraws (on every replica) and once its
``exp`` plus the leeway has passed; a refused token is never remembered; the cache is bounded."""

from __future__ import annotations

import asyncio
import time

import jwt
import pytest

from core_service.errors import UnauthenticatedError
from core_service.repository import member
from core_service.repository.db import transaction
from core_service.service.member_tokens import (
    ALGORITHM,
    AUDIENCE,
    CLOCK_LEEWAY_SECONDS,
    ISSUER,
    TokenAuthenticator,
    VerifiedToken,
    VerifiedTokens,
    issue_token,
    key_id,
)
from tests.core.harness import JWT_SECRET

OTHER_SECRET = "another-jwt-key-Hq2vX8nB4mK7pL1sT9wR5yC3eF6"


def _authenticator(engine) -> TokenAuthenticator:
    return TokenAuthenticator(engine, secret=JWT_SECRET)


def _signed(secret: str = JWT_SECRET, **claims: object) -> str:
    now = int(time.time())
    values = {"sub": "1", "iat": now, "exp": now + 600, "iss": ISSUER, "aud": AUDIENCE}
    values.update(claims)
    return jwt.encode(values, secret, algorithm=ALGORITHM, headers={"kid": key_id(JWT_SECRET)})


def _altered_signature(token: str) -> str:
    signed_part, signature = token.rsplit(".", 1)
    first = "B" if signature[0] != "B" else "C"  # six whole bits of the signature
    return f"{signed_part}.{first}{signature[1:]}"


async def test_a_remembered_token_is_refused_once_its_member_withdraws_on_every_replica(
    engine, members
):
    replicas = [_authenticator(engine), _authenticator(engine)]
    token = issue_token(1, secret=JWT_SECRET, ttl_seconds=600)
    for replica in replicas:
        assert await replica.member_id(token) == 1
        assert replica.tokens_held == 1

    async with transaction(engine) as conn:
        assert await member.withdraw(conn, 1)

    for replica in replicas:
        with pytest.raises(UnauthenticatedError, match="invalid or expired token"):
            await replica.member_id(token)
        # Without the database only the token is checked: the caller's statement must refuse.
        assert replica.verified_member_id(token) == 1


async def test_a_remembered_token_is_refused_once_its_exp_and_the_leeway_have_passed(
    engine, members
):
    authenticator = _authenticator(engine)
    # Expired, but within the leeway for one to two more seconds.
    exp = int(time.time()) - CLOCK_LEEWAY_SECONDS + 2
    token = _signed(iat=exp - 600, exp=exp)
    assert await authenticator.member_id(token) == 1
    assert authenticator.tokens_held == 1

    # Time must pass here: the moment PyJWT would refuse it (int(exp) <= now - leeway).
    await asyncio.sleep(max(0.0, exp + CLOCK_LEEWAY_SECONDS - time.time()) + 0.01)

    with pytest.raises(UnauthenticatedError):
        await authenticator.member_id(token)
    with pytest.raises(UnauthenticatedError):
        authenticator.verified_member_id(token)
    assert authenticator.tokens_held == 0


async def test_a_refused_token_is_never_remembered(engine, members):
    authenticator = _authenticator(engine)
    refused = [
        _signed(OTHER_SECRET),  # our kid, another key's signature
        _altered_signature(_signed()),
        _signed(exp=int(time.time()) + 8 * 24 * 3600),  # over the lifetime cap
        _signed(sub="01"),  # not canonical
    ]
    for token in refused:
        for _ in range(2):
            with pytest.raises(UnauthenticatedError):
                await authenticator.member_id(token)
            with pytest.raises(UnauthenticatedError):
                authenticator.verified_member_id(token)
    assert authenticator.tokens_held == 0


async def test_a_token_without_kid_needs_the_database(engine, members):
    """The old format is accepted only while the database says so: never without it."""
    authenticator = _authenticator(engine)
    now = int(time.time())
    legacy = jwt.encode({"sub": "1", "iat": now, "exp": now + 600}, JWT_SECRET, ALGORITHM)

    assert await authenticator.member_id(legacy) == 1
    with pytest.raises(UnauthenticatedError):
        authenticator.verified_member_id(legacy)


def test_the_cache_keeps_the_most_recently_used_tokens_up_to_its_capacity():
    cache = VerifiedTokens(capacity=2)
    later = time.time() + 600
    for name in ("a", "b"):
        cache.put(name, VerifiedToken(1, False, later))
    assert cache.get("a", time.time()) is not None  # "b" is now the least recently used
    cache.put("c", VerifiedToken(1, False, later))

    assert len(cache) == 2
    assert cache.get("b", time.time()) is None
    assert cache.get("a", time.time()) is not None
    assert cache.get("c", later) is None  # due: dropped when read
    assert len(cache) == 1
