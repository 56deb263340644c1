"""The keyword vocabulary an app draws filter chips from (``GET /api/v1/keywords``): every
active, non-``BLOCKED`` preset, the same for every member, with an entity tag of its exact
bytes so that a client's cached copy is answered 304 (docs/core-service.md "Keywords")."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import orjson
from sqlalchemy.ext.asyncio import AsyncEngine

from core_service.errors import UnauthenticatedError
from core_service.repository import keyword_preset
from core_service.repository.db import client_autocommit


@dataclass(frozen=True, slots=True)
class Vocabulary:
    """``body``: the JSON answer ``{"keywords": [{code, displayName, category, visibility}]}``;
    ``etag``: a strong entity tag of it (quoted, 32 hex digits of its SHA-256)."""

    body: bytes
    etag: str


class KeywordVocabulary:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def read(self, *, member_id: int) -> Vocabulary:
        """The vocabulary now, in one statement that also checks the member. Raises
        ``UnauthenticatedError`` (401: not an active member), ``UnavailableError`` (503)."""
        async with client_autocommit(self._engine) as conn:
            keywords = await keyword_preset.vocabulary(conn, viewer_id=member_id)
        if keywords is None:
            raise UnauthenticatedError()
        body = orjson.dumps(
            {
                "keywords": [
                    {
                        "code": k.code,
                        "displayName": k.display_name,
                        "category": k.category,
                        "visibility": k.visibility,
                    }
                    for k in keywords
                ]
            }
        )
        return Vocabulary(body, f'"{hashlib.sha256(body).hexdigest()[:32]}"')


def none_match(if_none_match: str | None, etag: str) -> bool:
    """Whether an ``If-None-Match`` header names ``etag`` (RFC 9110 13.1.2: ``*``, or a list of
    tags compared weakly, so ``W/"x"`` matches ``"x"``)."""
    if if_none_match is None:
        return False
    if if_none_match.strip() == "*":
        return True
    tags = (tag.strip() for tag in if_none_match.split(","))
    return any(tag.removeprefix("W/") == etag for tag in tags)
