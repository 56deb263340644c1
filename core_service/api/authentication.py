"""The bearer check of the client API, made before the request body is read.

FastAPI reads and JSON-decodes a body before it solves any dependency, router-level ones
included, so a dependency alone would read an unauthenticated caller's body and answer a
malformed one 422. Every route of the client API is an ``AuthenticatedRoute``: a request
without a valid token is refused (``UnauthenticatedError``, 401) with its body unread, and the
member id is left in ``request.state`` for the ``MemberId`` dependency (``dependencies.py``).
The member's state is read on every request (a withdrawal refuses its tokens at once), except
for an endpoint ``member_checked_by_operation``, whose own statement refuses an inactive member:
there a withdrawn member's still well-signed token gets its body read, then 401.
Bodies that are read are capped first by ``MAX_REQUEST_BYTES``
(``pinlog_platform.http.body_limit``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

from fastapi import Request, Response
from fastapi.routing import APIRoute
from fastapi.security.utils import get_authorization_scheme_param

from core_service.errors import UnauthenticatedError
from core_service.service.member_quotas import MemberQuotas, QuotaKind
from core_service.service.member_tokens import TokenAuthenticator


class AuthenticatedRoute(APIRoute):
    """A route whose handler authenticates the caller, then takes the member's quota (429 before
    the body is read), before FastAPI reads the body."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()
        kind = quota_kind(self.path_format, self.methods)
        member_checked = getattr(self.endpoint, _MEMBER_CHECKED, False)

        async def authenticated_handler(request: Request) -> Response:
            member_id = await authenticate(request, member_checked_by_operation=member_checked)
            request.state.member_id = member_id
            quotas: MemberQuotas = request.app.state.quotas
            if kind is not None:
                await quotas.admit(member_id, kind)
            return await handler(request)

        return authenticated_handler


# Reads that cost what a write costs: an export reads all of a member's data.
_WRITE_PRICED_READS = ("/members/me/export",)


def quota_kind(path: str, methods: set[str]) -> QuotaKind | None:
    """Searches take the search bucket; every other non-GET route and an export a write
    token; other reads none."""
    if path.endswith("/search"):
        return QuotaKind.SEARCH
    if methods & {"POST", "PUT", "PATCH", "DELETE"} or path.endswith(_WRITE_PRICED_READS):
        return QuotaKind.WRITE
    return None


_MEMBER_CHECKED = "pinlog_member_checked_by_operation"


def member_checked_by_operation(endpoint: Callable[..., Awaitable[Response]]):
    """Marks an endpoint whose one statement refuses an inactive member itself (a create locks
    the member ``FOR SHARE``): its token is verified without a database read. A withdrawn
    member is still refused at once, by that statement (401), across replicas."""
    setattr(endpoint, _MEMBER_CHECKED, True)
    return endpoint


async def authenticate(request: Request, *, member_checked_by_operation: bool = False) -> int:
    """The member named by ``Authorization: Bearer <token>``; ``UnauthenticatedError`` for a
    missing header, another scheme, or a token ``TokenAuthenticator`` refuses. The member's
    state is read from the database unless ``member_checked_by_operation`` (and the token is
    of the current format: only the database accepts the older one)."""
    scheme, token = get_authorization_scheme_param(request.headers.get("Authorization"))
    if scheme.lower() != "bearer" or not token:
        raise UnauthenticatedError("missing bearer token")
    authenticator: TokenAuthenticator = request.app.state.authenticator
    if member_checked_by_operation:
        with contextlib.suppress(UnauthenticatedError):
            return authenticator.verified_member_id(token)
    return await authenticator.member_id(token)
