"""The statuses and example bodies each client-API route documents, for its OpenAPI document
(``docs/openapi/core-client.json``, ``make openapi``). The statuses are those
docs/core-service.md lists; ``main.py`` maps the errors to them."""

from __future__ import annotations

from typing import Any


def _error(description: str, detail: str, **extra: Any) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"example": {"detail": detail, **extra}}},
    }


def _retry_after(answer: dict[str, Any]) -> dict[str, Any]:
    return {**answer, "headers": {"Retry-After": {"schema": {"type": "string"}, "example": "5"}}}


# Every error answer is {"detail": string}; a 422 adds "errors" (docs/core-service.md "Errors").
UNAUTHENTICATED = {
    401: _error(
        'Missing token ("missing bearer token"), or a token refused for any reason: bad '
        "signature, expired, revoked, or a withdrawn member's (one body for all)",
        "invalid or expired token",
    )
}
METHOD_NOT_ALLOWED = {
    405: _error(
        "This path does not take this method (the Allow header lists those it takes)",
        "Method Not Allowed",
    )
}
TOO_LARGE = {
    413: _error(
        "Request body over MAX_REQUEST_BYTES, by its Content-Length or as it streams (the same "
        "bytes either way)",
        "request body too large",
    )
}
UNPARSABLE = {
    400: _error(
        "A body that cannot be parsed at all (not UTF-8, JSON nested too deep)",
        "There was an error parsing the body",
    )
}
INVALID = {
    422: _error(
        "The request is invalid: one item per problem under errors; nothing was written and "
        "the input is not echoed",
        "invalid request",
        errors=[{"loc": ["body", "body"], "msg": "Field required", "type": "missing"}],
    )
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
RATE_LIMITED = {
    429: _retry_after(
        _error(
            "Over the member's quota (MEMBER_WRITES_PER_MINUTE, MEMBER_SEARCHES_PER_MINUTE, "
            "MEMBER_BURST, MEMBER_DAILY_NOTES); Retry-After in whole seconds",
            "too many requests; retry later",
        )
    )
}
INTERNAL = {500: _error("A fault of the service (logged with its SQLSTATE only)", "internal error")}
UNAVAILABLE = {
    503: _retry_after(
        _error(
            "Database (or, for search, the worker) unavailable, or the request deadline "
            "passed; retry later",
            "database unavailable",
        )
    )
}
UPSTREAM = {502: _error("The worker refused the search", "search failed")}
NOT_READY = {503: _error("Not ready: the database did not answer within 1 s", "unavailable")}
NOT_READY[503]["content"]["application/json"]["example"] = {"status": "unavailable"}

# Every /api/v1 route: the token is checked first; a body is bounded whatever the method; the
# database may be away; a path answers 405 for a method it does not take.
COMMON = {**UNAUTHENTICATED, **METHOD_NOT_ALLOWED, **TOO_LARGE, **INTERNAL, **UNAVAILABLE}
# Routes that read a JSON body: it may not parse (400) or not validate (422).
WITH_BODY = {**UNPARSABLE, **INVALID}
# Routes that take a quota token (every non-GET route; searches their own bucket).
QUOTA = RATE_LIMITED


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
            "score": 0.0648,
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
