"""Routes of the client API. No SQL and no decisions: services do the work, ``main.py`` maps
their errors to statuses (422 validation, 401 token, 404 not yours or missing, 409 state)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict
from typing import Annotated

from fastapi import APIRouter, Header, Path, Query, Response, status
from pydantic import BeforeValidator

from core_service.api.authentication import AuthenticatedRoute, member_checked_by_operation
from core_service.api.dependencies import (
    Exports,
    Keywords,
    Lifecycle,
    MemberId,
    Pages,
    Reader,
    Search,
)
from core_service.api.export_response import ExportResponse
from core_service.api.responses import (
    COMMON,
    CONFLICT,
    CREATED_EXAMPLE,
    EXPORT_EXAMPLE,
    INVALID,
    KEYWORDS_EXAMPLE,
    LIST_EXAMPLE,
    NOT_FOUND,
    PUBLIC_RECORD_EXAMPLE,
    QUOTA,
    RECORD_EXAMPLE,
    SEARCH_EXAMPLE,
    UPSTREAM,
    WITH_BODY,
    ok,
)
from core_service.api.schemas import (
    PUBLIC_ID_PATTERN,
    AiItem,
    ContextBody,
    ContextIdOnly,
    ContextItem,
    CreatedRecord,
    CreateRecordBody,
    KeywordItem,
    PlaceItem,
    PublicContextItem,
    PublicRecordItem,
    RecordAi,
    RecordItem,
    RecordList,
    RecordListItem,
    SearchBody,
    SearchResultItem,
    SearchResults,
)
from core_service.repository.record_view import KeywordView
from core_service.service.keyword_vocabulary import none_match
from core_service.service.record_reads import summarize
from pinlog_platform.bigint import BIGINT_MAX
from pinlog_platform.contract.canonical_ids import parse_canonical_id
from pinlog_platform.http.json_response import OrjsonResponse


def _canonical_id(value: object) -> object:
    """A path id spelled canonically (``[1-9][0-9]*`` within BIGINT); anything else fails
    validation, which ``main.py`` answers 404 for a path."""
    if parse_canonical_id(value) is None:
        raise ValueError("not a canonical id")
    return value


# A record's public id in a path (any other text is 404, as a missing record).
PublicId = Annotated[str, Path(pattern=PUBLIC_ID_PATTERN)]
# Ids in paths: ``1_0``, ``01``, ``+1``, `` 1``, ``1.0`` and other scripts' digits name nothing.
Id = Annotated[int, Path(ge=1, le=BIGINT_MAX), BeforeValidator(_canonical_id)]
# A count in a query spelled canonically too (422 otherwise).
PageSize = Annotated[int, Query(ge=1, le=100), BeforeValidator(_canonical_id)]
Cursor = Annotated[str | None, Query(min_length=1, max_length=200)]
# A preset code to browse by (app/presets: ^[A-Z][A-Z0-9_]*$, at most 50 characters).
KeywordCode = Annotated[
    str | None, Query(min_length=1, max_length=50, pattern=r"^[A-Z][A-Z0-9_]*$")
]


def _keyword_items(keywords: Iterable[KeywordView]) -> list[KeywordItem]:
    return [
        KeywordItem(code=k.code, display_name=k.display_name, category=k.category) for k in keywords
    ]


# Every route authenticates the caller before its body is read (401 before 422 or any work).
router = APIRouter(prefix="/api/v1", route_class=AuthenticatedRoute)


@router.post(
    "/records",
    status_code=status.HTTP_201_CREATED,
    responses={
        **ok(201, "A new record", CREATED_EXAMPLE),
        **ok(
            200,
            "The note joined the member's active record for the place",
            {**CREATED_EXAMPLE, "contextId": 68},
        ),
        **COMMON,
        **WITH_BODY,
        **QUOTA,
    },
)
@member_checked_by_operation
async def create_record(
    body: CreateRecordBody, member_id: MemberId, lifecycle: Lifecycle
) -> OrjsonResponse:
    """201 with a new record, 200 when the context joined the member's record for the place;
    both name the record's ``publicId`` (the id other members read its public view by)."""
    created = await lifecycle.create_record(
        member_id=member_id,
        external_place_id=body.external_place_id,
        place_name=body.place_name,
        body=body.body,
    )
    payload = CreatedRecord(
        record_id=created.record_id, context_id=created.context_id, public_id=created.public_id
    )
    return OrjsonResponse(
        payload.model_dump(by_alias=True),
        status_code=status.HTTP_201_CREATED if created.record_created else status.HTTP_200_OK,
    )


@router.post(
    "/records/{record_id}/contexts",
    status_code=status.HTTP_201_CREATED,
    responses={
        **ok(201, "The new context", {"contextId": 68}),
        **COMMON,
        **WITH_BODY,
        **QUOTA,
        **NOT_FOUND,
    },
    response_model=ContextIdOnly,
    response_model_by_alias=True,
)
@member_checked_by_operation
async def add_context(
    record_id: Id, body: ContextBody, member_id: MemberId, lifecycle: Lifecycle
) -> ContextIdOnly:
    context_id = await lifecycle.add_context(
        member_id=member_id, record_id=record_id, body=body.body
    )
    return ContextIdOnly(context_id=context_id)


@router.put(
    "/contexts/{context_id}",
    response_model=ContextIdOnly,
    response_model_by_alias=True,
    responses={
        **ok(200, "The contextId to use from now on", {"contextId": 69}),
        **COMMON,
        **WITH_BODY,
        **QUOTA,
        **NOT_FOUND,
        **CONFLICT,
    },
)
@member_checked_by_operation
async def modify_context(
    context_id: Id, body: ContextBody, member_id: MemberId, lifecycle: Lifecycle
) -> ContextIdOnly:
    """The ``contextId`` to use from now on (the old one for an unchanged body)."""
    modified = await lifecycle.modify_context(
        member_id=member_id, context_id=context_id, body=body.body
    )
    return ContextIdOnly(context_id=modified.context_id)


@router.delete(
    "/contexts/{context_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses={**COMMON, **QUOTA, **NOT_FOUND, **CONFLICT},
)
@member_checked_by_operation
async def delete_context(context_id: Id, member_id: MemberId, lifecycle: Lifecycle) -> Response:
    await lifecycle.delete_context(member_id=member_id, context_id=context_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.delete(
    "/records/{record_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses={**COMMON, **QUOTA, **NOT_FOUND},
)
async def delete_record(record_id: Id, member_id: MemberId, lifecycle: Lifecycle) -> Response:
    await lifecycle.delete_record(member_id=member_id, record_id=record_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.delete("/members/me", status_code=status.HTTP_204_NO_CONTENT, responses={**COMMON, **QUOTA})
async def withdraw(member_id: MemberId, lifecycle: Lifecycle) -> Response:
    await lifecycle.withdraw_member(member_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get(
    "/records",
    response_model=RecordList,
    response_model_by_alias=True,
    responses={**ok(200, "One page of the member's records", LIST_EXAMPLE), **COMMON, **INVALID},
)
async def list_records(
    member_id: MemberId,
    pages: Pages,
    limit: PageSize = 20,
    cursor: Cursor = None,
    keyword: KeywordCode = None,
) -> RecordList:
    """The member's own active records, newest first; ``nextCursor`` asks for the next page.
    ``keyword=CODE``: only records carrying that keyword in the owner's view, the cursor bound
    to it; an unknown, inactive or ``BLOCKED`` code is 422."""
    page = await pages.page(member_id=member_id, limit=limit, cursor=cursor, keyword=keyword)
    return RecordList(
        records=[
            RecordListItem(
                record_id=r.summary.record_id,
                public_id=r.summary.public_id,
                place=PlaceItem(
                    external_place_id=r.summary.external_place_id, name=r.summary.place_name
                ),
                context_count=r.summary.context_count,
                keywords=_keyword_items(r.summary.keywords),
                created_at=r.summary.created_at,
                ai=RecordAi(state=r.ai_state, **r.summary.ai_counts),
            )
            for r in page.records
        ],
        next_cursor=page.next_cursor,
    )


@router.get(
    "/records/{record_id}",
    response_model=RecordItem,
    response_model_by_alias=True,
    response_model_exclude_none=True,
    responses={
        **ok(200, "The caller's own record", RECORD_EXAMPLE),
        **COMMON,
        **NOT_FOUND,
    },
)
@member_checked_by_operation
async def get_record(record_id: Id, member_id: MemberId, reader: Reader) -> RecordItem:
    """The caller's own record: bodies, each context's AI state, ``PUBLIC`` + ``PRIVATE_ONLY``
    keywords. Another member's record is 404 exactly as a missing one (its public view is
    ``GET /api/v1/public-records/{publicId}``; §9 Deviation)."""
    view = await reader.get(viewer_id=member_id, record_id=record_id)
    return RecordItem(
        record_id=view.record_id,
        public_id=view.public_id,
        place=PlaceItem(external_place_id=view.external_place_id, name=view.place_name),
        contexts=[
            ContextItem(
                context_id=c.context_id,
                body=c.body,
                created_at=c.created_at,
                ai=None if c.ai is None else AiItem(**asdict(summarize(c.ai))),
            )
            for c in view.contexts
        ],
        keywords=_keyword_items(view.keywords),
    )


@router.get(
    "/public-records/{public_id}",
    response_model=PublicRecordItem,
    response_model_by_alias=True,
    responses={
        **ok(200, "The record's public view, the same for every member", PUBLIC_RECORD_EXAMPLE),
        **COMMON,
        **NOT_FOUND,
    },
)
@member_checked_by_operation
async def get_public_record(
    public_id: PublicId, member_id: MemberId, reader: Reader
) -> PublicRecordItem:
    """Any active record's public view by its ``publicId``: the place, each live note's time,
    ``PUBLIC`` keywords; no ids, bodies or AI states. 404 for a missing or deleted record, or
    an id not of the public id's form."""
    view = await reader.get_public(viewer_id=member_id, public_id=public_id)
    return PublicRecordItem(
        public_id=view.public_id,
        place=PlaceItem(external_place_id=view.external_place_id, name=view.place_name),
        contexts=[PublicContextItem(created_at=t) for t in view.context_times],
        keywords=_keyword_items(view.keywords),
    )


# The keyword vocabulary is the same for every member and changes only when presets are
# loaded: a client may keep it for five minutes, and ask again with its ETag.
KEYWORDS_CACHE_CONTROL = "private, max-age=300"


@router.get(
    "/keywords",
    responses={
        **ok(200, "Every active, non-BLOCKED keyword preset", KEYWORDS_EXAMPLE),
        304: {"description": "If-None-Match names the current ETag; no body"},
        **COMMON,
    },
)
@member_checked_by_operation
async def keywords(
    member_id: MemberId,
    vocabulary: Keywords,
    if_none_match: Annotated[str | None, Header(max_length=1000)] = None,
) -> Response:
    """The keyword vocabulary (filter chips, ``keyword=CODE`` of the list): ``{keywords:
    [{code, displayName, category, visibility}]}``, every active preset that is not
    ``BLOCKED``, in the preset list's order, the same for every member. ``Cache-Control:
    private, max-age=300`` and a strong ``ETag``; 304 without a body when ``If-None-Match``
    names it (docs/core-service.md "Keywords")."""
    found = await vocabulary.read(member_id=member_id)
    headers = {"ETag": found.etag, "Cache-Control": KEYWORDS_CACHE_CONTROL}
    if none_match(if_none_match, found.etag):
        return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers=headers)
    return Response(found.body, media_type="application/json", headers=headers)


@router.get(
    "/members/me/export",
    responses={
        **ok(200, "The member's own data as one streamed JSON document", EXPORT_EXAMPLE),
        **COMMON,
        **QUOTA,
    },
)
@member_checked_by_operation
async def export(member_id: MemberId, exports: Exports) -> Response:
    """The member's active records with their live notes (bodies), keywords and AI state, as
    one JSON document streamed page by page from one snapshot; takes a token of the member's
    write bucket (429 when empty). The request deadline covers the first byte; then each chunk
    has its own, and the whole export ends within 5 minutes (cut off: the connection closes
    before the document's end). docs/core-service.md "Export"."""
    stream = await exports.open(member_id=member_id)
    return ExportResponse(stream, member_id=member_id, chunk_seconds=exports.chunk_seconds)


@router.post(
    "/search",
    response_model=SearchResults,
    response_model_by_alias=True,
    responses={
        **ok(200, "The member's matching records, best fused score first", SEARCH_EXAMPLE),
        **COMMON,
        **WITH_BODY,
        **QUOTA,
        **UPSTREAM,
    },
)
async def search(body: SearchBody, member_id: MemberId, service: Search) -> SearchResults:
    """The member's own records that match the query, lexically, semantically or by keyword,
    best fused score first (§7 and its Additions; docs/search.md)."""
    hits = await service.search(member_id=member_id, query=body.query, limit=body.limit)
    return SearchResults(
        results=[
            SearchResultItem(
                record_id=h.record_id,
                context_id=h.context_id,
                place=PlaceItem(
                    external_place_id=h.shown.external_place_id, name=h.shown.place_name
                ),
                keywords=_keyword_items(h.shown.keywords),
                similarity=h.similarity,
                keyword_matched=h.keyword_matched,
                matched_by=list(h.matched_by),
                score=h.score,
            )
            for h in hits
            if h.shown is not None
        ]
    )
