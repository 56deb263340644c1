"""The 422 answer of both services for a request that fails validation (§6).

Unlike FastAPI's default handler it never echoes the rejected input back: the input can be a
member's note, and echoed answers end up in client logs.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError

from pinlog_platform.http.json_response import OrjsonResponse

# The core's 422 ``detail``; its items are under ``errors`` (docs/core-service.md "Errors").
INVALID_REQUEST = "invalid request"


def error_items(exc: RequestValidationError) -> list[dict[str, object]]:
    """``[{"loc": [...], "msg": str, "type": str}, ...]``, one item per failing field, without
    the ``input`` FastAPI would add."""
    return [
        {"loc": list(error.get("loc", ())), "msg": error.get("msg", ""), "type": error.get("type")}
        for error in exc.errors()
    ]


async def validation_error(_request: Request, exc: RequestValidationError) -> OrjsonResponse:
    """The worker's HTTP 422 ``{"detail": [{"loc": [...], "msg": str, "type": str}, ...]}``
    (§8; the core answers ``{"detail": "invalid request", "errors": [...]}`` instead)."""
    return OrjsonResponse({"detail": error_items(exc)}, status_code=422)
