"""Signing keys rotate without logging anyone out (docs/operations.md
"Signing keys"): tokens carry ``kid``, ``iss`` and ``aud``; previous keys verify; a lifetime
over the cap is refused; tokens of the old format are accepted only for the cap after the
upgrade."""

from __future__ import annotations

import time

import jwt
from sqlalchemy import text

from core_service.service.member_tokens import (
    ALGORITHM,
    AUDIENCE,
    ISSUER,
    issue_token,
    key_id,
)
from tests.core.harness import JWT_SECRET

NEW_SECRET = "rotated-jwt-key-Zq7xW2mN9pL4vK8sR3tY6uB1cE5"
PATH = "/api/v1/records/999999"  # authenticated: 404; refused: 401


def header(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def signed(claims: dict, secret: str = JWT_SECRET, **headers: object) -> str:
    return jwt.encode(claims, secret, algorithm=ALGORITHM, headers=headers or None)


def claims(**overrides: object) -> dict:
    now = int(time.time())
    values = {"sub": "1", "iat": now, "exp": now + 600, "iss": ISSUER, "aud": AUDIENCE}
    values.update(overrides)
    return {k: v for k, v in values.items() if v is not None}


async def status(core, token: str) -> int:
    return (await core.client.get(PATH, headers=header(token))).status_code


def test_the_kid_is_derived_from_the_key():
    token = issue_token(1, secret=JWT_SECRET, ttl_seconds=60)
    assert jwt.get_unverified_header(token)["kid"] == key_id(JWT_SECRET)
    assert len(key_id(JWT_SECRET)) == 8 and key_id(JWT_SECRET) != key_id(NEW_SECRET)
    decoded = jwt.decode(token, JWT_SECRET, algorithms=[ALGORITHM], audience=AUDIENCE)
    assert decoded["iss"] == ISSUER


async def test_a_token_of_the_previous_key_verifies_during_rotation_and_not_after(make_core):
    old_token = issue_token(1, secret=JWT_SECRET, ttl_seconds=600)
    async with make_core("http://127.0.0.1:9", jwt_secret=NEW_SECRET) as dropped:
        assert await status(dropped, old_token) == 401
    async with make_core(
        "http://127.0.0.1:9", jwt_secret=NEW_SECRET, jwt_previous_secrets=JWT_SECRET
    ) as rotating:
        new_token = issue_token(1, secret=NEW_SECRET, ttl_seconds=600)
        assert await status(rotating, old_token) == 404
        assert await status(rotating, new_token) == 404
    # A replica not yet switched: still signs with the old key, already verifies the new one.
    async with make_core("http://127.0.0.1:9", jwt_previous_secrets=NEW_SECRET) as lagging:
        assert await status(lagging, new_token) == 404
        assert await status(lagging, old_token) == 404


async def test_lifetime_issuer_audience_and_kid_are_checked(core_with_fake_worker):
    kid = key_id(JWT_SECRET)
    core = core_with_fake_worker
    now = int(time.time())
    assert await status(core, signed(claims(), kid=kid)) == 404
    # Issued by a replica whose clock runs 30 s ahead: accepted.
    assert await status(core, signed(claims(iat=now + 30, exp=now + 630), kid=kid)) == 404
    refused = [
        signed(claims(exp=now + 8 * 24 * 3600), kid=kid),  # over the 7-day cap
        signed(claims(exp=str(now + 600)), kid=kid),  # non-numeric exp
        signed(claims(iss="someone-else"), kid=kid),
        signed(claims(iss=None), kid=kid),
        signed(claims(aud="another-api"), kid=kid),
        signed(claims(aud=None), kid=kid),
        signed(claims(), kid="AAAAAAAA"),  # unknown kid
        signed(claims(), secret=NEW_SECRET, kid=kid),  # kid of our key, another signature
        signed(claims(exp=now - 120), kid=kid),
    ]
    for token in refused:
        assert await status(core, token) == 401


async def test_old_format_tokens_are_accepted_for_the_cap_after_the_upgrade(
    core_with_fake_worker, engine
):
    core = core_with_fake_worker
    now = int(time.time())
    legacy = signed({"sub": "1", "iat": now, "exp": now + 600})
    assert await status(core, legacy) == 404
    assert await status(core, signed({"sub": "1", "iat": now, "exp": now + 600}, NEW_SECRET)) == 401
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE core.token_format SET upgraded_at = now() - interval '8 days'")
        )
    try:
        assert await status(core, legacy) == 401
    finally:
        async with engine.begin() as conn:
            await conn.execute(text("UPDATE core.token_format SET upgraded_at = now()"))
