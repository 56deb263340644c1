"""Typed dependencies of the routes: services from the app state and the caller's member id."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from core_service.errors import UnauthenticatedError
from core_service.service.lifecycle import ContextLifecycle
from core_service.service.member_tokens import TokenAuthenticator
from core_service.service.personal_search import PersonalSearch
from core_service.service.record_reads import RecordReader

_bearer = HTTPBearer(auto_error=False)


def _lifecycle(request: Request) -> ContextLifecycle:
    return request.app.state.lifecycle


def _reader(request: Request) -> RecordReader:
    return request.app.state.reader


def _search(request: Request) -> PersonalSearch:
    return request.app.state.search


async def _member_id(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> int:
    """The authenticated member; ``UnauthenticatedError`` (401) without a valid token."""
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise UnauthenticatedError("missing bearer token")
    authenticator: TokenAuthenticator = request.app.state.authenticator
    return await authenticator.member_id(credentials.credentials)


Lifecycle = Annotated[ContextLifecycle, Depends(_lifecycle)]
Reader = Annotated[RecordReader, Depends(_reader)]
Search = Annotated[PersonalSearch, Depends(_search)]
MemberId = Annotated[int, Depends(_member_id)]
