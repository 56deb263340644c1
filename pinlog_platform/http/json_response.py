"""``OrjsonResponse``: a JSON answer rendered by ``orjson``, for the bodies a service builds by
hand (error answers, readiness, a route choosing its own status); used by both services.

The bytes are those of Starlette's ``JSONResponse`` (UTF-8, no escapes of non-ASCII, no
spaces) for the bodies we send: strings, integers, booleans, ``None``, lists and dicts with
string keys. Routes with a ``response_model`` are not rendered here: FastAPI serialises those
straight to JSON through pydantic, which is as fast and must not be given a response class
(that would turn off its direct path).
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import JSONResponse


class OrjsonResponse(JSONResponse):
    """``JSONResponse`` whose ``render`` is ``orjson.dumps`` (a fraction of ``json.dumps``'s
    CPU); raises ``orjson.JSONEncodeError`` (a ``TypeError``) for content it cannot encode."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)
