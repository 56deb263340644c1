"""The statuses and example bodies each client-API route documents, for its OpenAPI document
(``docs/openapi/core-client.json``, ``make openapi``). The statuses are those
docs/core-service.md lists; ``main.py`` maps the errors to them."""

from __future__ import annotations

from typing import Any


def _error(description: str, detail: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"example": {"detail": detail}}},
    }


UNAUTHENTICATED = {
    401: _error("Missing, malformed or expired token, or withdrawn member", "unauthenticated")
}
TOO_LARGE = {413: _error("Request body over MAX_REQUEST_BYTES", "request body too large")}
INVALID = {
    422: _error("Validation error; nothing was written and the body is not echoed", "invalid body")
}
NOT_FOUND = {404: _error("No such record or context of this member", "record not found")}
CONFLICT = {
    409: {
        "description": (
            "Replaced (replacedBy: the live end of its replacements), already deleted (with"
            " replacedBy when its replacements end in a deleted context), or the record's last"
            " active context"
        ),
        "content": {
            "application/json": {"example": {"detail": "context was replaced", "replacedBy": 69}}
        },
    }
}
UNAVAILABLE = {
    503: {
        **_error("Database (or, for search, the worker) unavailable; retry later", "unavailable"),
        "headers": {"Retry-After": {"schema": {"type": "string"}, "example": "5"}},
    }
}
UPSTREAM = {502: _error("The worker refused the search", "search failed")}

# Every route: the token is checked first; bodies are bounded; the database may be away.
COMMON = {**UNAUTHENTICATED, **TOO_LARGE, **INVALID, **UNAVAILABLE}


def ok(status: int, description: str, example: Any) -> dict[int, dict[str, Any]]:
    """A success status with an example body."""
    return {
        status: {
            "description": description,
            "content": {"application/json": {"example": example}},
        }
    }


PUBLIC_ID_EXAMPLE = "q3Xo9vS0dJ2m1-aK7_bQZw"
CREATED_EXAMPLE = {"recordId": 65, "contextId": 67, "publicId": PUBLIC_ID_EXAMPLE}
RECORD_EXAMPLE = {
    "recordId": 65,
    "publicId": PUBLIC_ID_EXAMPLE,
    "place": {"externalPlaceId": "my-place", "name": "동네 카페"},
    "contexts": [
        {
            "contextId": 67,
            "body": "창가 자리가 조용해서 노트북 작업하기 좋음",
            "createdAt": "2026-12-01T10:00:00+00:00",
            "ai": {"state": "completed"},
        }
    ],
    "keywords": [{"code": "STUDY_WORK", "displayName": "공부/작업", "category": "ACTIVITY"}],
}
PUBLIC_RECORD_EXAMPLE = {
    "publicId": PUBLIC_ID_EXAMPLE,
    "place": {"externalPlaceId": "my-place", "name": "동네 카페"},
    "contexts": [{"createdAt": "2026-12-01T10:00:00+00:00"}],
    "keywords": [{"code": "STUDY_WORK", "displayName": "공부/작업", "category": "ACTIVITY"}],
}
LIST_EXAMPLE = {
    "records": [
        {
            "recordId": 65,
            "publicId": PUBLIC_ID_EXAMPLE,
            "place": {"externalPlaceId": "my-place", "name": "동네 카페"},
            "contextCount": 1,
            "keywords": [
                {"code": "STUDY_WORK", "displayName": "공부/작업", "category": "ACTIVITY"}
            ],
            "createdAt": "2026-12-01T10:00:00+00:00",
            "ai": {
                "state": "completed",
                "pending": 0,
                "processing": 0,
                "completed": 1,
                "failed": 0,
            },
        }
    ],
    "nextCursor": "MjAyNi0xMi0wMVQxMDowMDowMCswMDowMC82NQ",
}
SEARCH_EXAMPLE = {
    "results": [
        {
            "recordId": 65,
            "contextId": 67,
            "place": {"externalPlaceId": "my-place", "name": "동네 카페"},
            "keywords": [
                {"code": "STUDY_WORK", "displayName": "공부/작업", "category": "ACTIVITY"}
            ],
            "similarity": 0.56,
            "keywordMatched": True,
            "matchedBy": ["lexical", "semantic", "keyword"],
            "score": 0.0492,
        }
    ]
}
KEYWORDS_EXAMPLE = {
    "keywords": [
        {
            "code": "STUDY_WORK",
            "displayName": "공부/작업",
            "category": "ACTIVITY",
            "visibility": "PUBLIC",
        }
    ]
}
EXPORT_EXAMPLE = {
    "memberId": 1,
    "exportedAt": "2026-12-07T10:00:00+00:00",
    "records": [
        {
            "recordId": 65,
            "publicId": PUBLIC_ID_EXAMPLE,
            "place": {"externalPlaceId": "my-place", "name": "동네 카페"},
            "createdAt": "2026-12-01T10:00:00+00:00",
            "keywords": [
                {"code": "STUDY_WORK", "displayName": "공부/작업", "category": "ACTIVITY"}
            ],
            "contexts": [
                {
                    "contextId": 67,
                    "body": "창가 자리가 조용해서 노트북 작업하기 좋음",
                    "createdAt": "2026-12-01T10:00:00+00:00",
                    "ai": {"state": "completed"},
                    "keywords": [
                        {
                            "code": "STUDY_WORK",
                            "displayName": "공부/작업",
                            "category": "ACTIVITY",
                            "confidence": 0.82,
                        }
                    ],
                }
            ],
        }
    ],
}
