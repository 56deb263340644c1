"""Errors of the core service; ``main.py`` maps each class to one HTTP status.

Leaf module: imports nothing from the service. Messages are fixed or describe the input's
shape, never its text (a note must not be echoed, §6).
"""

from __future__ import annotations


class CoreError(Exception):
    """Base class of every error the core service maps to an HTTP status."""


class InvalidRequestError(CoreError, ValueError):
    """A request the core refuses as invalid after validation let it through: HTTP 422,
    answered like a validation error, ``{"detail": "invalid request", "errors": [{"loc",
    "msg", "type": "value_error"}]}``; ``loc`` names the part of the request (``("body",
    "placeName")``, ``("query", "cursor")``; empty when no one part is to blame)."""

    loc: tuple[str, ...] = ()

    def __init__(self, message: str, *, loc: tuple[str, ...] | None = None) -> None:
        super().__init__(message)
        if loc is not None:
            self.loc = loc


class InvalidBodyError(InvalidRequestError):
    """A note body (or another free text of the body) that cannot be stored (blank, too long,
    unencodable): HTTP 422; ``loc`` ``("body", <field>)``."""

    loc = ("body",)


class InvalidCursorError(InvalidRequestError):
    """A list cursor this service did not issue (malformed, or not a position): HTTP 422."""

    loc = ("query", "cursor")


class InvalidInputError(InvalidRequestError):
    """Client input the database cannot hold or compute with (a data exception of a statement
    bound to it, SQLSTATE class 22) that validation let through: HTTP 422."""


class InvalidKeywordError(InvalidRequestError):
    """A keyword code to browse by that is unknown, inactive or ``BLOCKED``: HTTP 422."""

    loc = ("query", "keyword")


class NotFoundError(CoreError):
    """No such record or context for this member, or one of another member: HTTP 404.

    Existence of other members' data is never revealed, so both cases share one message.
    """

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} not found")


class ConflictError(CoreError):
    """The change contradicts the current state (replaced, already deleted, last context):
    HTTP 409.

    ``replaced_by``: where a replaced context's chain of replacements (edits,
    ``pinlog-core retry-failed``) ends, which the answer names as ``replacedBy``."""

    def __init__(self, message: str, *, replaced_by: int | None = None) -> None:
        super().__init__(message)
        self.replaced_by = replaced_by


# The one 401 answer for a token that is not accepted, whatever the reason (bad signature,
# expired, revoked, or a withdrawn member's): telling them apart would tell a caller that a
# token is well signed.
UNAUTHENTICATED_DETAIL = "invalid or expired token"


class UnauthenticatedError(CoreError):
    """A missing, malformed, expired or revoked bearer token, or a withdrawn member's: HTTP 401.
    Every refused token answers ``UNAUTHENTICATED_DETAIL``; only a missing one says so."""

    def __init__(self, message: str = UNAUTHENTICATED_DETAIL) -> None:
        super().__init__(message)


class RateLimitedError(CoreError):
    """The member is over a quota: HTTP 429 with ``Retry-After``."""

    def __init__(self, retry_after_seconds: int) -> None:
        super().__init__("too many requests; retry later")
        self.retry_after_seconds = retry_after_seconds


class UnavailableError(CoreError):
    """A dependency (database, worker) cannot answer now; retrying later may help: HTTP 503."""


class UpstreamError(CoreError):
    """The worker refused a request in a way retrying will not fix: HTTP 502."""


class DatabaseFault(CoreError):
    """A database error that retrying will not fix: a bug of ours, HTTP 500. Its message names
    the SQLSTATE and constraint only: the driver's text can quote row values (a note)."""
