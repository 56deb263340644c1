"""Request and response bodies of the client API (JSON, camelCase).

Strict types: ids are JSON integers, text fields JSON strings; unknown fields are ignored.
The note body's own rules (blank, 500 characters after normalisation) are the domain's
(``service/context_body.py``), so the API, the domain and the database CHECK agree; here a raw
body is only bounded so that a huge payload is refused before any work.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

RAW_TEXT_MAX = 10_000  # characters before normalisation; the stored limit is 500 after it

RawText = Annotated[StrictStr, Field(max_length=RAW_TEXT_MAX)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=False)


class CreateRecordBody(_Body):
    """``POST /api/v1/records``."""

    # Normalised and checked by the domain (NFC, trimmed, visible, 100 / 200 characters).
    external_place_id: Annotated[StrictStr, Field(alias="externalPlaceId", max_length=1000)]
    place_name: Annotated[StrictStr, Field(alias="placeName", max_length=1000)]
    body: RawText


class ContextBody(_Body):
    """``POST /api/v1/records/{recordId}/contexts`` and ``PUT /api/v1/contexts/{contextId}``."""

    body: RawText


class SearchBody(_Body):
    """``POST /api/v1/search``: a body, so the query never lands in access logs (§6)."""

    query: RawText
    limit: Annotated[StrictInt, Field(ge=1, le=100)] = 20


# A record's public id: 22 characters, the unpadded base64url spelling of 128 random bits.
PUBLIC_ID_PATTERN = r"^[A-Za-z0-9_-]{22}$"


class CreatedRecord(BaseModel):
    """``publicId``: the id other members read the record's public view by."""

    record_id: int = Field(serialization_alias="recordId")
    context_id: int = Field(serialization_alias="contextId")
    public_id: str = Field(serialization_alias="publicId")


class ContextIdOnly(BaseModel):
    context_id: int = Field(serialization_alias="contextId")


class AiItem(BaseModel):
    """A context's AI state for its owner: exactly ``state``, plus ``stage`` and
    ``reason`` when ``state`` is ``failed`` (``None`` fields are left out of the body)."""

    state: str
    stage: str | None = None
    reason: str | None = None


class ContextItem(BaseModel):
    """A live context in its owner's view (``ai`` absent without a state row)."""

    context_id: int = Field(serialization_alias="contextId")
    body: str
    created_at: datetime = Field(serialization_alias="createdAt")
    ai: AiItem | None = None


class KeywordItem(BaseModel):
    code: str
    display_name: str = Field(serialization_alias="displayName")
    category: str


class PlaceItem(BaseModel):
    external_place_id: str = Field(serialization_alias="externalPlaceId")
    name: str


class RecordItem(BaseModel):
    """``GET /api/v1/records/{recordId}``: the owner's view."""

    record_id: int = Field(serialization_alias="recordId")
    public_id: str = Field(serialization_alias="publicId")
    place: PlaceItem
    contexts: list[ContextItem]
    keywords: list[KeywordItem]


class PublicContextItem(BaseModel):
    created_at: datetime = Field(serialization_alias="createdAt")


class PublicRecordItem(BaseModel):
    """``GET /api/v1/public-records/{publicId}``: the view every member gets; no record or
    context ids, bodies, AI states or private keywords."""

    public_id: str = Field(serialization_alias="publicId")
    place: PlaceItem
    contexts: list[PublicContextItem]
    keywords: list[KeywordItem]


class RecordAi(BaseModel):
    """A record's AI state over its live contexts, and how many contexts are in each state."""

    state: Literal["pending", "processing", "completed", "failed"]
    pending: int
    processing: int
    completed: int
    failed: int


class RecordListItem(BaseModel):
    """One item of ``GET /api/v1/records``; field names shared with ``RecordItem``."""

    record_id: int = Field(serialization_alias="recordId")
    public_id: str = Field(serialization_alias="publicId")
    place: PlaceItem
    context_count: int = Field(serialization_alias="contextCount")
    keywords: list[KeywordItem]
    created_at: datetime = Field(serialization_alias="createdAt")
    ai: RecordAi


class RecordList(BaseModel):
    records: list[RecordListItem]
    next_cursor: str | None = Field(serialization_alias="nextCursor")


class SearchResultItem(BaseModel):
    """One record (docs/search.md): ``similarity`` null while its context has no live vector
    of the profile in use; ``matchedBy`` lists ``lexical``, ``semantic``, ``keyword``;
    ``score`` is the fused (reciprocal rank) score; ``place`` and ``keywords`` as the record
    read shows them to its owner."""

    record_id: int = Field(serialization_alias="recordId")
    context_id: int = Field(serialization_alias="contextId")
    place: PlaceItem
    keywords: list[KeywordItem]
    similarity: float | None
    keyword_matched: bool = Field(serialization_alias="keywordMatched")
    matched_by: list[Literal["lexical", "semantic", "keyword"]] = Field(
        serialization_alias="matchedBy"
    )
    score: float


class SearchResults(BaseModel):
    results: list[SearchResultItem]
