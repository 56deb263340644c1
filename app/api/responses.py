"""The statuses and example bodies each internal route documents (§8), for its OpenAPI
document (``docs/openapi/worker-internal.json``, ``make openapi``); ``main.py`` maps the
errors to them."""

from __future__ import annotations

from typing import Any


def _answer(description: str, example: Any, **extra: Any) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"example": example}},
        **extra,
    }


_RETRY_AFTER = {"Retry-After": {"schema": {"type": "string"}, "example": "5"}}

COMMON: dict[int | str, dict[str, Any]] = {
    401: _answer("Missing or wrong X-Internal-Secret", {"detail": "unauthorized"}),
    413: _answer("Request body over MAX_REQUEST_BYTES", {"detail": "request body too large"}),
    422: _answer("Validation error; nothing queued", {"detail": "invalid request"}),
}
PROCESS: dict[int | str, dict[str, Any]] = {
    202: _answer("Queued", {"contextId": 67}),
    503: _answer(
        "Queue full, shutting down, or a provider unavailable",
        {"detail": "worker queue full"},
        headers=_RETRY_AFTER,
    ),
    **COMMON,
}
BACKFILL: dict[int | str, dict[str, Any]] = {
    200: _answer(
        "Counts by result",
        {"completed": 63, "cancelled": 1, "failed": 0, "notClaimed": 0, "lost": 0},
    ),
    409: _answer("Another embedding profile", {"detail": "this worker serves embedding profile"}),
    503: _answer(
        "Busy, or the provider or database unavailable; the rows were put back",
        {"detail": "backfill refused: busy"},
        headers=_RETRY_AFTER,
    ),
    **COMMON,
}
SEARCH: dict[int | str, dict[str, Any]] = {
    200: _answer(
        "The user's closest records, best first (§7)",
        {
            "results": [
                {"recordId": 65, "contextId": 67, "similarity": 0.56, "keywordMatched": True}
            ]
        },
    ),
    502: _answer(
        "The embedding provider failed permanently", {"detail": "embedding upstream failed"}
    ),
    503: _answer(
        "Embedding provider or database unavailable",
        {"detail": "embedding upstream unavailable"},
        headers=_RETRY_AFTER,
    ),
    **COMMON,
}
