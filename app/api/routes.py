"""Routes of the worker (§8). Services arrive through typed dependencies."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, status
from fastapi.responses import JSONResponse

from app.api import responses
from app.api.schemas import (
    BackfillBody,
    ContextSimilarityItem,
    KeywordBatchBody,
    KeywordHitItem,
    ProcessContextBody,
    SearchBody,
    SearchResponse,
    SearchResult,
)
from app.service.batch_backfill import BatchBackfill
from app.service.health import Readiness
from app.service.keyword_batches import KeywordBatches
from app.service.profile_backfill import (
    BackfillRefused,
    ProfileBackfill,
    WrongProfile,
)
from app.service.provider_gate import ProviderRefusalPolicy
from app.service.requests import ProcessRequest
from app.service.search import SearchService
from app.service.worker_pool import WorkerPool
from pinlog_platform import tracing

RETRY_AFTER_SECONDS = 5


# The dependencies are coroutines on purpose: FastAPI runs a plain ``def`` dependency in a
# worker thread, a thread hop per request on the accept path.


async def _pool(request: Request) -> WorkerPool:
    return request.app.state.pool


async def _readiness(request: Request) -> Readiness:
    return request.app.state.readiness


async def _search(request: Request) -> SearchService:
    return request.app.state.search


async def _refusals(request: Request) -> ProviderRefusalPolicy:
    return request.app.state.provider_refusals


async def _backfill(request: Request) -> ProfileBackfill:
    return request.app.state.backfill


async def _batches(request: Request) -> BatchBackfill | None:
    return request.app.state.batches


async def _keyword_batches(request: Request) -> KeywordBatches | None:
    return request.app.state.keyword_batches


Pool = Annotated[WorkerPool, Depends(_pool)]
ReadinessCheck = Annotated[Readiness, Depends(_readiness)]
Search = Annotated[SearchService, Depends(_search)]
ProviderRefusals = Annotated[ProviderRefusalPolicy, Depends(_refusals)]
Backfill = Annotated[ProfileBackfill, Depends(_backfill)]
Batches = Annotated[BatchBackfill | None, Depends(_batches)]
KeywordBatchSubmitter = Annotated[KeywordBatches | None, Depends(_keyword_batches)]

router = APIRouter()


@router.post(
    "/internal/v1/context/process",
    status_code=status.HTTP_202_ACCEPTED,
    responses=responses.PROCESS,
)
async def process_context(
    body: ProcessContextBody, pool: Pool, refusals: ProviderRefusals, request: Request
) -> JSONResponse:
    """Queue a context for processing: 202, or 503 with ``Retry-After`` (whole seconds) when
    a provider is unavailable (its gate is open: the time until its next probe; never 202 for
    work that will not run; unless ``PINLOG_REFUSE_WHILE_PROVIDER_UNAVAILABLE`` is
    off), or when the queue is full or the pool is shutting down (from the queue's drain rate:
    ``WorkerPool.retry_after_seconds``; the pool counts the refusal). 409 when the request
    names an ``embeddingProfile`` this worker does not serve (the core routes by profile)."""
    # The profile is read from the app only when the request names one: no dependency to
    # solve on the accept path (the core names it; other callers may not).
    profile = None if body.embedding_profile is None else request.app.state.readiness.profile
    if profile is not None and body.embedding_profile != profile:
        return JSONResponse(
            {"detail": f"this worker serves embedding profile {profile!r}"},
            status_code=status.HTTP_409_CONFLICT,
        )
    refusal = refusals.refusal()
    if refusal is not None:
        return JSONResponse(
            {"detail": f"{refusal.providers} provider unavailable"},
            status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": str(refusal.retry_after_seconds)},
        )
    accepted = pool.submit(
        ProcessRequest(
            context_id=body.context_id,
            user_id=body.user_id,
            record_id=body.record_id,
            text=body.text,
            trace_context=tracing.current_context(),
        )
    )
    if not accepted:
        return JSONResponse(
            {"detail": "worker queue full"},
            status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": str(pool.retry_after_seconds())},
        )
    return JSONResponse({"contextId": body.context_id}, status_code=status.HTTP_202_ACCEPTED)


@router.post(
    "/internal/v1/search",
    response_model=SearchResponse,
    response_model_by_alias=True,
    # contextSimilarities and keywordHits only when the request named contextIds.
    response_model_exclude_unset=True,
    responses=responses.SEARCH,
)
async def search(body: SearchBody, service: Search) -> SearchResponse:
    """Personal search (§7): 200, or 422 / 502 / 503 mapped in ``main.py`` (§6)."""
    answer = await service.search(
        user_id=body.user_id,
        query=body.query,
        limit=body.limit,
        embedding_profile=body.embedding_profile,
        context_ids=None if body.context_ids is None else list(body.context_ids),
    )
    additions = {}
    if answer.additions is not None:
        additions = {
            "context_similarities": [
                ContextSimilarityItem(context_id=c.context_id, similarity=c.similarity)
                for c in answer.additions.context_similarities
            ],
            "keyword_hits": [
                KeywordHitItem(
                    record_id=k.record_id,
                    context_id=k.context_id,
                    similarity=k.similarity,
                    confidence=k.confidence,
                )
                for k in answer.additions.keyword_hits
            ],
        }
    return SearchResponse(
        results=[
            SearchResult(
                record_id=h.record_id,
                context_id=h.context_id,
                similarity=h.similarity,
                keyword_matched=h.keyword_matched,
            )
            for h in answer.hits
        ],
        matched_keyword_ids=answer.matched_keyword_ids,
        **additions,
    )


@router.post("/internal/v1/backfill/embed", responses=responses.BACKFILL)
async def backfill_embed(body: BackfillBody, backfill: Backfill, batches: Batches) -> JSONResponse:
    """Embed a batch of contexts under this worker's profile for a re-embedding backfill
    (``app.service.profile_backfill``): 200 with counts by result; an item whose text digest
    or owner is not the one the core wrote on the state row, or whose context is no longer
    live, claims nothing and costs no provider call (``notClaimed``); one not embedded within
    the batch's share of the request deadline is put back (``putBack``, still 200: what was
    saved stays); 409 for another profile;
    413 for a body over ``maxRequestBytes`` (``/readyz``); 422 for a malformed body (a
    ``contextId`` twice included); 503 with ``Retry-After`` (whole seconds) when busy or the
    provider or database is unavailable (the claimed rows were put back to ``PENDING``).

    With ``"via": "batch"`` the rows are claimed and submitted as one provider batch instead
    (``app.service.batch_backfill``): 200 ``{"batchId", "batched", "failed", "notClaimed"}``
    (``batchId`` null when nothing was submitted); 409 when this worker's provider takes no
    batches (``/readyz`` ``batch`` false)."""
    items = [ProcessRequest(c.context_id, c.user_id, c.record_id, c.text) for c in body.contexts]
    try:
        if body.via == "batch":
            if batches is None:
                return _takes_no_batches("provider")
            submitted = await batches.submit(body.embedding_profile, items)
            return JSONResponse(submitted.as_json())
        report = await backfill.run(body.embedding_profile, items)
    except (WrongProfile, BackfillRefused) as exc:
        return _refused(exc, "backfill")
    return JSONResponse(report.as_json())


def _takes_no_batches(provider: str) -> JSONResponse:
    """409: this worker's ``provider`` (``provider`` or ``judge``) takes no batches."""
    return JSONResponse(
        {"detail": f"this worker's {provider} takes no batches"},
        status_code=status.HTTP_409_CONFLICT,
    )


def _refused(exc: WrongProfile | BackfillRefused, what: str) -> JSONResponse:
    """409 for another profile (``WrongProfile``); 503 with ``Retry-After`` (whole seconds)
    for ``what`` refused (``BackfillRefused``)."""
    if isinstance(exc, WrongProfile):
        return JSONResponse({"detail": str(exc)}, status_code=status.HTTP_409_CONFLICT)
    return JSONResponse(
        {"detail": f"{what} refused: {exc.cause}"},
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
        headers={"Retry-After": str(exc.retry_after_seconds)},
    )


@router.post("/internal/v1/batch/keywords", responses=responses.BACKFILL)
async def batch_keywords(body: KeywordBatchBody, batches: KeywordBatchSubmitter) -> JSONResponse:
    """Judge the keyword stages a ``reprocess keywords --via batch`` marked, by the judge
    provider's Batch API (``app.service.keyword_batches``; docs/contract.md §2 and §9,
    Deviation "batch-held work"): 200 ``{"batchId", "batched", "completed", "failed",
    "notClaimed"}`` (``batchId`` null when nothing was submitted; ``completed``: no candidate,
    saved with no call; ``notClaimed``: not marked, not the core's text or owner, no live
    vector of the profile, or taken elsewhere); 409 for another profile or when this worker's
    judge takes no batches (``/readyz`` ``keywordBatch`` false); 413 over ``maxRequestBytes``;
    422 for a malformed body; 503 with ``Retry-After`` (whole seconds) while the judge or the
    database is unavailable or the submission failed."""
    if batches is None:
        return _takes_no_batches("judge")
    items = [ProcessRequest(c.context_id, c.user_id, c.record_id, c.text) for c in body.contexts]
    try:
        submitted = await batches.submit(body.embedding_profile, items)
    except (WrongProfile, BackfillRefused) as exc:
        return _refused(exc, "keyword batch")
    return JSONResponse(submitted.as_json())


@router.get("/readyz")
async def readyz(readiness: ReadinessCheck) -> JSONResponse:
    """Readiness: database reachable and presets loaded (200), else 503 with ``problems``
    naming what is missing. The body is pinned (other components read it):
    ``{"status", "mode", "profile", "presetVersion", "maxRequestBytes", "batch",
    "keywordBatch", "providers": {"embedding": {"available", "retryAfterSeconds", "reason"},
    "judge": {...}}}``.
    ``batch``: whether this worker sends backfills by its provider's Batch API when the core
    asks (``PINLOG_EMBEDDING_BATCH_API``); ``keywordBatch``: whether it judges a keyword
    reprocess by its judge's Batch API (``PINLOG_JUDGE_BATCH_API``).
    ``maxRequestBytes``: the largest request body this worker takes (bytes; larger answer
    413); the core cuts its backfill batches to fit it. A provider's unavailability is reported
    in ``providers`` and never changes the status code: the process can still serve.

    ``mode`` is ``offline`` when the worker runs with ``PINLOG_OFFLINE`` (local models).
    """
    problems = await readiness.problems()
    body: dict[str, object] = {
        "status": "unavailable" if problems else "ready",
        "mode": readiness.mode,
        "profile": readiness.profile,
        "presetVersion": readiness.preset_version(),
        "maxRequestBytes": readiness.max_request_bytes,
        "batch": readiness.batch,
        "keywordBatch": readiness.keyword_batch,
        "providers": readiness.providers(),
    }
    if problems:
        body["problems"] = problems
        return JSONResponse(body, status_code=503)
    return JSONResponse(body)
