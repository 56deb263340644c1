"""Request bodies of the internal API (§3, §8, FC-11).

Ids are JSON integers 1..2^63-1 (strings, floats, booleans, zero, negatives and overflow are
422); ``text`` is a JSON string (missing or null is 422, ``""`` is accepted: it fails the
embedding stage later, FC-09). Unknown fields are ignored so the core side can add them first.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator

from pinlog_platform.bigint import BIGINT_MAX

ContextId = Annotated[StrictInt, Field(ge=1, le=BIGINT_MAX)]


class ContextNote(BaseModel):
    """One context: its ids and its note, as the core stored it (a backfill batch's item)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    context_id: ContextId = Field(alias="contextId")
    user_id: ContextId = Field(alias="userId")
    record_id: ContextId = Field(alias="recordId")
    text: StrictStr


class ProcessContextBody(ContextNote):
    """``POST /internal/v1/context/process``."""

    place_meta: dict[str, Any] | None = Field(default=None, alias="placeMeta")
    # The profile the core routes this request for; a worker of another profile answers 409.
    # Absent: any (a caller that knows of one profile only).
    embedding_profile: StrictStr | None = Field(
        default=None, alias="embeddingProfile", max_length=100
    )


class BackfillBody(BaseModel):
    """``POST /internal/v1/backfill/embed``: 1 to 256 contexts to embed under
    ``embeddingProfile`` (docs/operations.md "Switching the embedding profile")."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    embedding_profile: StrictStr = Field(alias="embeddingProfile", max_length=100)
    contexts: Annotated[list[ContextNote], Field(min_length=1, max_length=256)]
    # sync: embedded now; batch: submitted as one provider batch (app.service.batch_backfill).
    via: Literal["sync", "batch"] = "sync"

    @field_validator("contexts")
    @classmethod
    def _distinct_contexts(cls, contexts: list[ContextNote]) -> list[ContextNote]:
        # One text per context: the claim checks each text's digest against the state row.
        if len({c.context_id for c in contexts}) != len(contexts):
            raise ValueError("contextId values must be distinct")
        return contexts


class KeywordBatchBody(BaseModel):
    """``POST /internal/v1/batch/keywords``: 1 to 256 contexts whose keyword stages a
    ``reprocess keywords --via batch`` marked, judged under ``embeddingProfile``'s presets
    (docs/operations.md "Reprocess via the Batch API")."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    embedding_profile: StrictStr = Field(alias="embeddingProfile", max_length=100)
    contexts: Annotated[list[ContextNote], Field(min_length=1, max_length=256)]

    @field_validator("contexts")
    @classmethod
    def _distinct_contexts(cls, contexts: list[ContextNote]) -> list[ContextNote]:
        # One text per context: the claim checks each text's digest against the state row.
        if len({c.context_id for c in contexts}) != len(contexts):
            raise ValueError("contextId values must be distinct")
        return contexts


class SearchBody(BaseModel):
    """``POST /internal/v1/search`` (§7); ``limit`` defaults to 20, at most 100."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    user_id: ContextId = Field(alias="userId")
    query: StrictStr
    limit: Annotated[StrictInt, Field(ge=1, le=100)] = 20
    embedding_profile: StrictStr = Field(alias="embeddingProfile", max_length=100)
    # The core's fused search (docs/contract.md §7, Addition "fused search"): the contexts its
    # own lists found, for their cosines; absent, the answer is §7's list alone.
    context_ids: Annotated[list[ContextId], Field(max_length=200)] | None = Field(
        default=None, alias="contextIds"
    )


class SearchResult(BaseModel):
    record_id: int = Field(serialization_alias="recordId")
    context_id: int = Field(serialization_alias="contextId")
    similarity: float
    keyword_matched: bool = Field(serialization_alias="keywordMatched")


class ContextSimilarityItem(BaseModel):
    context_id: int = Field(serialization_alias="contextId")
    similarity: float


class KeywordHitItem(BaseModel):
    record_id: int = Field(serialization_alias="recordId")
    context_id: int = Field(serialization_alias="contextId")
    similarity: float
    confidence: float | None


class SearchResponse(BaseModel):
    """§7's ``results``; ``matchedKeywordIds`` always; ``contextSimilarities`` and
    ``keywordHits`` only when the request named ``contextIds`` (§7 Addition)."""

    results: list[SearchResult]
    matched_keyword_ids: list[int] = Field(serialization_alias="matchedKeywordIds")
    context_similarities: list[ContextSimilarityItem] | None = Field(
        default=None, serialization_alias="contextSimilarities"
    )
    keyword_hits: list[KeywordHitItem] | None = Field(
        default=None, serialization_alias="keywordHits"
    )
