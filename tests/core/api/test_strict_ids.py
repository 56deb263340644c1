"""Ids are parsed strictly: a path id or a token's ``sub`` is canonical ASCII
decimal within BIGINT, or it names nothing: 404 for a path, 401 for a token."""

from __future__ import annotations

import time

import jwt
import pytest

from core_service.service.member_tokens import ALGORITHM, AUDIENCE, ISSUER, key_id
from tests.core.harness import JWT_SECRET, bearer

ARABIC_INDIC = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")
FULLWIDTH = str.maketrans("0123456789", "０１２３４５６７８９")


def spellings(canonical: str) -> list[str]:
    return [
        f"0{canonical}",
        f"+{canonical}",
        f" {canonical}",
        f"{canonical} ",
        f"{canonical}.0",
        f"{canonical[0]}_{canonical[1:]}" if len(canonical) > 1 else f"0_{canonical}",
        canonical.translate(ARABIC_INDIC),
        canonical.translate(FULLWIDTH),
        f"{canonical}e0",
    ]


def token(sub: object) -> dict[str, str]:
    now = int(time.time())
    claims = {"sub": sub, "iat": now, "exp": now + 600, "iss": ISSUER, "aud": AUDIENCE}
    kid = key_id(JWT_SECRET)
    signed = jwt.encode(claims, JWT_SECRET, algorithm=ALGORITHM, headers={"kid": kid})
    return {"Authorization": f"Bearer {signed}"}


async def test_every_non_canonical_path_id_is_404_like_a_missing_record(core_with_fake_worker):
    client = core_with_fake_worker.client
    record_id = (await core_with_fake_worker.create(1, "메모")).json()["recordId"]
    missing = await client.get("/api/v1/records/999999999", headers=bearer(1))
    assert (await client.get(f"/api/v1/records/{record_id}", headers=bearer(1))).status_code == 200

    for spelled in [*spellings(str(record_id)), "0", str(2**63), "-1", "1x"]:
        response = await client.get(f"/api/v1/records/{spelled}", headers=bearer(1))
        assert (response.status_code, response.json()) == (404, missing.json()), spelled
        deleted = await client.delete(f"/api/v1/contexts/{spelled}", headers=bearer(1))
        assert (deleted.status_code, deleted.json()) == (404, {"detail": "context not found"})
    assert (await client.get(f"/api/v1/records/{record_id}", headers=bearer(1))).status_code == 200


@pytest.mark.parametrize("sub", [*spellings("1"), 1, "", "1\n", None])
async def test_a_non_canonical_token_subject_is_401(core_with_fake_worker, sub):
    response = await core_with_fake_worker.client.get("/api/v1/records/1", headers=token(sub))
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"


async def test_the_canonical_subject_authenticates(core_with_fake_worker):
    response = await core_with_fake_worker.client.get("/api/v1/records/1", headers=token("1"))
    assert response.status_code == 404  # authenticated; no such record
