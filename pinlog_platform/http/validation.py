"""The 422 answer of both services for a request that fails validation (§6).

Unlike FastAPI's default handler it never echoes the rejected input back: the input can be a
member's note, and echoed answers end up in client logs.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError

from pinlog_platform.http.json_response import OrjsonResponse


async def validation_error(_request: Request, exc: RequestValidationError) -> OrjsonResponse:
    """HTTP 422 ``{"detail": [{"loc": [...], "msg": str, "type": str}, ...]}``, one item per
    failing field, without the ``input`` FastAPI would add."""
    detail = [
        {"loc": list(error.get("loc", ())), "msg": error.get("msg", ""), "type": error.get("type")}
        for error in exc.errors()
    ]
    return OrjsonResponse({"detail": detail}, status_code=422)
