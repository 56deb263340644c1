"""Personal search, ``POST /internal/v1/search`` (CONTRACT §5, §6, §7, §8, §10 #3/#19/#20,
FC-04, FC-10).

Every search runs against the real worker on uvicorn; the query is embedded by the fake OpenAI
server with ``hash_embed``, so the expected ranking is computed here with the same function
(exact cosine of unit vectors = dot product) and compared with what the worker answers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import unicodedata
from typing import Any

import httpx
import numpy as np
import pytest
from sqlalchemy import text

from app.providers.hashing import hash_embed
from tests.fake_openai import Scripted, embedding_body
from tests.worker.harness import PROFILE, SECRET, RunningWorker
from tests.worker.open_transactions import cancel_context
from tests.worker.support import make_embedding, make_state

SEARCH_PATH = "/internal/v1/search"
DIMENSION = 1536
QUERY = "조용한 카페에서 노트북으로 공부하기"

# Notes and their cosine with QUERY under hash_embed (checked by _similarity in the tests).
BEST = "조용한 카페에서 공부하기 좋음"  # ~0.71
CLOSE = "조용한 카페, 노트북 들고 공부하기 좋음"  # ~0.56
LAPTOP = "카페에서 노트북 작업"  # ~0.48
DESSERT = "조용한 카페 분위기, 디저트 맛있음"  # ~0.29
PUB = "친구들과 맥주 마시기 좋은 시끄러운 펍"  # ~0.01
WALK = "바다가 보이는 산책로"  # ~0.01

UPSTREAM_LEAK = "upstream-secret-detail sk-leaked-0123456789"


# --------------------------------------------------------------------------- helpers


async def search(
    worker: RunningWorker,
    *,
    user_id: Any = 1,
    query: Any = QUERY,
    limit: Any = None,
    profile: Any = PROFILE,
    secret: str | None = SECRET,
) -> httpx.Response:
    body: dict[str, Any] = {"userId": user_id, "query": query, "embeddingProfile": profile}
    if limit is not None:
        body["limit"] = limit
    return await post_search(worker, body, secret=secret)


async def post_search(
    worker: RunningWorker, body: dict[str, Any], *, secret: str | None = SECRET
) -> httpx.Response:
    headers = {} if secret is None else {"X-Internal-Secret": secret}
    return await worker.client.post(SEARCH_PATH, json=body, headers=headers)


def _reject_constant(constant: str) -> Any:
    raise ValueError(f"non-standard JSON constant {constant!r} in the response")


def strict_json(response: httpx.Response) -> Any:
    """The body parsed as RFC 8259 JSON: ``NaN``, ``Infinity`` and ``-Infinity`` are errors."""
    return json.loads(response.text, parse_constant=_reject_constant)


def hits(response: httpx.Response) -> list[tuple[int, int]]:
    """``(recordId, contextId)`` of each result, in the order answered."""
    assert response.status_code == 200, response.text
    return [(r["recordId"], r["contextId"]) for r in strict_json(response)["results"]]


def _similarity(query: str, note: str) -> float:
    return float(np.dot(hash_embed(query, DIMENSION), hash_embed(note, DIMENSION)))


def expected_ranking(
    query: str, notes: list[tuple[int, int, str]], limit: int = 20
) -> list[tuple[int, int, float]]:
    """``(record_id, context_id, similarity)`` per §7 for ``notes`` of ``(context_id,
    record_id, text)``: each record's best context, best first, then ``limit``."""
    best: dict[int, tuple[int, float]] = {}
    for context_id, record_id, note in notes:
        similarity = _similarity(query, note)
        if record_id not in best or similarity > best[record_id][1]:
            best[record_id] = (context_id, similarity)
    ranked = sorted(best.items(), key=lambda item: -item[1][1])
    return [(record, context, similarity) for record, (context, similarity) in ranked][:limit]


async def seed(
    engine,
    *,
    context_id: int,
    record_id: int,
    note: str | None = None,
    user_id: int = 1,
    embedding: np.ndarray | None = None,
    profile: str = PROFILE,
    embedding_status: str = "COMPLETED",
    is_deleted: bool = False,
) -> None:
    """A stored vector and its state row, as if the worker had embedded ``note``."""
    await make_state(engine, context_id=context_id, embedding_status=embedding_status)
    await make_embedding(
        engine,
        context_id=context_id,
        user_id=user_id,
        record_id=record_id,
        embedding=hash_embed(note, DIMENSION) if embedding is None else embedding,
        profile=profile,
        is_deleted=is_deleted,
    )


async def seed_notes(engine, notes: list[tuple[int, int, str]], *, user_id: int = 1) -> None:
    for context_id, record_id, note in notes:
        await seed(engine, context_id=context_id, record_id=record_id, note=note, user_id=user_id)


def app_records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("app.") and r.levelno == level]


def assert_same_ranking(response: httpx.Response, expected: list[tuple[int, int, float]]) -> None:
    results = strict_json(response)["results"]
    assert [(r["recordId"], r["contextId"]) for r in results] == [(r, c) for r, c, _ in expected]
    for result, (_, _, similarity) in zip(results, expected, strict=True):
        assert result["similarity"] == pytest.approx(similarity, abs=1e-4)


# --------------------------------------------------------------------------- §7: 200 shape


async def test_s7_results_are_best_first_with_only_record_context_and_finite_similarity(
    engine, worker, fake_openai
):
    """§7: ``{"results": [{"recordId", "contextId", "similarity", "keywordMatched"}]}``, best
    first, cosine in -1..1, and no body text anywhere in the response (seeded through the real
    pipeline)."""
    notes = [(1, 10, DESSERT), (2, 20, BEST), (3, 30, PUB), (4, 40, LAPTOP)]
    for context_id, record_id, note in notes:
        await make_state(engine, context_id=context_id)
        await worker.process(context_id, note, user_id=7, record_id=record_id)

    response = await search(worker, user_id=7)

    assert response.status_code == 200
    body = strict_json(response)
    # matchedKeywordIds: the §7 Addition "fused search" (docs/contract.md); nothing else.
    assert set(body) == {"results", "matchedKeywordIds"}
    assert [set(result) for result in body["results"]] == [
        {"recordId", "contextId", "similarity", "keywordMatched"}
    ] * len(notes)
    for result in body["results"]:
        assert isinstance(result["recordId"], int) and isinstance(result["contextId"], int)
        assert isinstance(result["similarity"], float)
        assert math.isfinite(result["similarity"]) and -1.0 <= result["similarity"] <= 1.0
    similarities = [result["similarity"] for result in body["results"]]
    assert similarities == sorted(similarities, reverse=True)
    assert_same_ranking(response, expected_ranking(QUERY, notes))
    assert response.text.isascii(), "Korean text (a note or the query) leaked into the response"
    for note in [QUERY, *(note for _, _, note in notes)]:
        assert note not in response.text


async def test_s7_whole_query_is_embedded_in_exactly_one_call_without_decomposition(
    engine, worker, fake_openai
):
    """§7: one embedding call with the whole query as its only input; the judge is not used."""
    await seed_notes(engine, [(1, 10, BEST), (2, 20, PUB)])
    query = "조용한 카페에서 공부하기. 친구들과 맥주, 그리고 바다가 보이는 산책로!"

    response = await search(worker, query=query)

    assert response.status_code == 200
    assert fake_openai.embedding_calls == 1
    assert [request["input"] for request in fake_openai.embedding_requests] == [[query]]
    assert fake_openai.judge_calls == 0


async def test_s7_opposite_vector_has_similarity_minus_one_and_is_still_answered(engine, worker):
    """§7: no similarity floor; cosine stays within -1..1 even for the antipodal vector."""
    await seed(engine, context_id=1, record_id=10, embedding=-hash_embed(QUERY, DIMENSION))
    await seed(engine, context_id=2, record_id=20, note=QUERY)

    results = strict_json(await search(worker))["results"]

    assert [(r["recordId"], r["contextId"]) for r in results] == [(20, 2), (10, 1)]
    assert [r["similarity"] for r in results] == pytest.approx([1.0, -1.0], abs=1e-6)
    assert all(-1.0 <= r["similarity"] <= 1.0 for r in results)


async def test_s7_limit_defaults_to_20(engine, worker):
    """§7/§8: without ``limit`` at most 20 records are answered; ``limit: 100`` answers all 25."""
    await seed_notes(engine, [(i, 100 + i, f"{BEST} {i}번째 메모") for i in range(1, 26)])

    default = await search(worker)
    hundred = await search(worker, limit=100)

    assert len(hits(default)) == 20
    assert len(hits(hundred)) == 25
    assert hits(default) == hits(hundred)[:20]


async def test_s7_user_id_at_bigint_max_is_accepted(engine, worker):
    """FC-11 for search: ``userId`` 2^63-1 is a valid BIGINT and is searched like any other."""
    await seed(engine, context_id=1, record_id=10, note=BEST, user_id=2**63 - 1)

    response = await search(worker, user_id=2**63 - 1)

    assert hits(response) == [(10, 1)]


# --------------------------------------------------------------------------- §10 #20


async def test_scenario20_record_with_several_matching_contexts_appears_once_with_its_best(
    engine, worker
):
    """§10 #20: three contexts of record 10 match; it appears once, with context 2 (its best,
    deliberately neither the lowest nor the highest id)."""
    notes = [(1, 10, CLOSE), (2, 10, BEST), (3, 10, DESSERT), (4, 20, LAPTOP)]
    await seed_notes(engine, notes)

    response = await search(worker)

    assert hits(response) == [(10, 2), (20, 4)]
    assert_same_ranking(response, expected_ranking(QUERY, notes))


async def test_scenario20_limit_applies_after_deduplication(engine, worker):
    """§7: 3 records x 2 contexts, ``limit: 2`` -> 2 distinct records (the two best contexts
    overall both belong to record 10, so a limit before de-duplication would give one record)."""
    notes = [
        (101, 10, BEST),
        (102, 10, CLOSE),
        (201, 20, LAPTOP),
        (202, 20, PUB),
        (301, 30, DESSERT),
        (302, 30, WALK),
    ]
    top_two_rows = sorted(notes, key=lambda n: -_similarity(QUERY, n[2]))[:2]
    assert {record for _, record, _ in top_two_rows} == {10}  # the setup is meaningful
    await seed_notes(engine, notes)

    response = await search(worker, limit=2)

    assert hits(response) == [(10, 101), (20, 201)]
    assert_same_ranking(response, expected_ranking(QUERY, notes, limit=2))


# --------------------------------------------------------------------------- §10 #19


async def test_scenario19_other_users_contexts_never_appear_even_when_closest(engine, worker):
    """§10 #19: user 2's vector equals the query's (similarity 1) and user 3's is close; user 1
    sees only its own records, and each user only theirs."""
    await seed(engine, context_id=1, record_id=10, note=PUB, user_id=1)
    await seed(engine, context_id=2, record_id=20, note=QUERY, user_id=2)
    await seed(engine, context_id=3, record_id=10, note=BEST, user_id=3)  # same record id

    assert hits(await search(worker, user_id=1)) == [(10, 1)]
    assert hits(await search(worker, user_id=2)) == [(20, 2)]
    assert hits(await search(worker, user_id=3)) == [(10, 3)]
    assert hits(await search(worker, user_id=4)) == []


# --------------------------------------------------------------------------- §10 #3


async def test_scenario3_old_context_is_not_in_results_after_an_edit(engine, worker):
    """§10 #3 with §9's modify: new context created and processed, old one cancelled
    (``is_deleted`` + both ``CANCELLED``). Searching the old text finds the record only
    through its new context."""
    await make_state(engine, context_id=1)
    await worker.process(1, BEST, user_id=7, record_id=70)
    assert hits(await search(worker, user_id=7, query=BEST)) == [(70, 1)]

    await make_state(engine, context_id=2)
    await cancel_context(engine, context_id=1)
    await worker.process(2, PUB, user_id=7, record_id=70)

    assert hits(await search(worker, user_id=7, query=BEST)) == [(70, 2)]


async def test_scenario3_vectors_whose_embedding_status_is_not_completed_are_excluded(
    engine, worker
):
    """§7: ``embedding_status = 'COMPLETED'`` is a filter of its own: vectors with
    ``is_deleted = false`` whose state is ``FAILED``, ``CANCELLED``, ``PENDING`` or
    ``PROCESSING`` are never answered, even at similarity 1; neither is a vector with no state
    row at all (the search joins it)."""
    for context_id, status in enumerate(["FAILED", "CANCELLED", "PENDING", "PROCESSING"], 1):
        await seed(
            engine, context_id=context_id, record_id=10 * context_id, note=QUERY,
            embedding_status=status,
        )  # fmt: skip
    await make_embedding(
        engine, context_id=5, user_id=1, record_id=50, embedding=hash_embed(QUERY, DIMENSION),
        profile=PROFILE,
    )  # fmt: skip
    await seed(engine, context_id=6, record_id=60, note=PUB)

    assert hits(await search(worker)) == [(60, 6)]


async def test_scenario3_vector_marked_deleted_is_excluded_even_if_state_says_completed(
    engine, worker
):
    """§7: ``is_deleted = false`` is a filter of its own (the state row alone does not decide)."""
    await seed(engine, context_id=1, record_id=10, note=QUERY, is_deleted=True)
    await seed(engine, context_id=2, record_id=20, note=PUB)

    assert hits(await search(worker)) == [(20, 2)]


async def test_s5_vector_of_another_profile_is_excluded(engine, worker):
    """§5/§7: a ``COMPLETED`` vector stored under another profile is not comparable: excluded."""
    await seed(engine, context_id=1, record_id=10, note=QUERY, profile="other-model-1536-cos-v2")
    await seed(engine, context_id=2, record_id=20, note=PUB)

    assert hits(await search(worker)) == [(20, 2)]


# --------------------------------------------------------------------------- §5


async def test_s5_profile_mismatch_is_422_without_embedding_call_and_logs_both_profiles(
    engine, worker, fake_openai, caplog
):
    """§5: a search under another profile is 422, no embedding call, both values logged."""
    await seed(engine, context_id=1, record_id=10, note=BEST)
    other = "openai-text-embedding-3-large-3072-cosine-v1"

    response = await search(worker, profile=other)

    assert response.status_code == 422
    assert response.json() == {"detail": "embedding profile mismatch"}
    assert fake_openai.embedding_calls == 0
    warnings = [r.getMessage() for r in app_records(caplog, logging.WARNING)]
    assert any(other in message and PROFILE in message for message in warnings), warnings


# --------------------------------------------------------------------------- FC-04


async def test_fc04_stored_zero_vector_never_yields_nan_and_never_appears(engine, worker):
    """FC-04: cosine against an all-zero vector is NaN, which PostgreSQL sorts first. Record 10
    has a zero vector and a real one (answered through the real one); record 30 has only a zero
    vector (never answered); the body is strict JSON with finite similarities."""
    zero = np.zeros(DIMENSION, np.float32)
    await seed(engine, context_id=1, record_id=10, embedding=zero)
    await seed(engine, context_id=2, record_id=20, note=DESSERT)
    await seed(engine, context_id=3, record_id=10, note=PUB)
    await seed(engine, context_id=4, record_id=30, embedding=zero)

    response = await search(worker)

    assert response.status_code == 200
    results = strict_json(response)["results"]
    assert all(math.isfinite(r["similarity"]) for r in results)
    assert [(r["recordId"], r["contextId"]) for r in results] == [(20, 2), (10, 3)]


async def test_fc04_provider_zero_vector_for_the_query_is_502_not_nan(worker, fake_openai):
    """FC-04/§6: an all-zero query vector from the provider is a permanent upstream fault."""
    fake_openai.script_embeddings(Scripted(json=embedding_body([np.zeros(DIMENSION)])))

    response = await search(worker)

    assert response.status_code == 502
    assert strict_json(response) == {"detail": "embedding upstream failed"}


# --------------------------------------------------------------------------- FC-10


async def test_fc10_nfd_and_nfc_queries_send_identical_nfc_text_and_return_identical_results(
    engine, worker, fake_openai
):
    nfc = QUERY
    nfd = unicodedata.normalize("NFD", nfc)
    assert nfd != nfc and unicodedata.is_normalized("NFC", nfc)
    await seed_notes(engine, [(1, 10, BEST), (2, 20, DESSERT), (3, 30, PUB)])

    from_nfd = await search(worker, query=nfd)
    from_nfc = await search(worker, query=nfc)

    sent = [request["input"] for request in fake_openai.embedding_requests]
    assert sent == [[nfc], [nfc]]
    assert sent[0][0].encode("utf-8") == sent[1][0].encode("utf-8") == nfc.encode("utf-8")
    assert len(hits(from_nfc)) == 3
    assert strict_json(from_nfd) == strict_json(from_nfc)


# --------------------------------------------------------------------------- §6 mapping


@pytest.mark.parametrize(
    ("upstream_status", "error_type", "status", "detail"),
    [
        (503, "server_error", 503, "embedding upstream unavailable"),
        # Provider-wide: 503 like an outage, never 502.
        (401, "invalid_api_key", 503, "embedding upstream unavailable"),
    ],
    ids=["transient-503", "provider-wide-401-503"],
)
async def test_s6_provider_failure_maps_to_a_fixed_body_without_upstream_text(
    engine, worker, fake_openai, caplog, upstream_status, error_type, status, detail
):
    await seed(engine, context_id=1, record_id=10, note=BEST)
    fake_openai.script_embeddings(
        Scripted(
            status=upstream_status,
            json={"error": {"message": UPSTREAM_LEAK, "type": error_type}},
        )
    )

    response = await search(worker)

    assert response.status_code == status
    # A transient failure says when to come back; a permanent one does not.
    assert response.headers.get("Retry-After") == ("5" if status == 503 else None)
    assert response.json() == {"detail": detail}
    assert UPSTREAM_LEAK not in response.text
    assert all(UPSTREAM_LEAK not in r.getMessage() for r in caplog.records if r.levelno >= 20)


async def test_s6_blank_query_is_422_without_embedding_call(worker, fake_openai):
    """§6/FC-09 for search: a query blank after normalisation cannot be embedded: 422 naming
    the query, no provider call."""
    statuses = {}
    for query in ("   ", "\u200b", "\u3000\u200b\n", "\ufeff\u3164", ""):
        response = await search(worker, query=query)
        statuses[repr(query)] = (response.status_code, "query" in response.json()["detail"])

    assert set(statuses.values()) == {(422, True)}, statuses
    assert fake_openai.embedding_calls == 0


async def _search_backend_waiting_on_a_lock(engine) -> int:
    """The pid of the worker's search query once it waits for a lock on the vectors (polled,
    bounded). Read from ``pg_locks``: ``pg_stat_activity.query`` keeps only the statement's
    first ``track_activity_query_size`` bytes, which need not name the table."""
    deadline = time.monotonic() + 10
    async with engine.connect() as conn:
        while time.monotonic() < deadline:
            pid = (
                await conn.execute(
                    text(
                        "SELECT pid FROM pg_locks "
                        "WHERE relation = 'ai.context_embedding'::regclass AND NOT granted "
                        "AND pid <> pg_backend_pid()"
                    )
                )
            ).scalar()
            await conn.commit()  # pg_stat_activity is a snapshot per transaction
            if pid is not None:
                return pid
            await asyncio.sleep(0.01)
    raise AssertionError("the search query never waited on the lock")


async def test_query_the_model_finds_too_long_is_422_not_502(engine, worker, fake_openai, caplog):
    """§6 mapping: the provider's ``context_length_exceeded`` is the caller's
    input, like our own length check: 422, a WARNING, no ERROR, no upstream text."""
    fake_openai.script_embeddings(
        Scripted(
            status=400,
            json={"error": {"message": UPSTREAM_LEAK, "code": "context_length_exceeded"}},
        )
    )

    response = await search(worker)

    assert response.status_code == 422
    assert response.json() == {"detail": "query text is longer than the model accepts"}
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert UPSTREAM_LEAK not in caplog.text


async def test_s6_cancelled_database_query_is_503_database_unavailable(engine, worker):
    """§6: a transient database error on the search path (its query cancelled by the server,
    SQLSTATE 57014, while it waits behind another session's exclusive lock) is 503 with the
    fixed body ``database unavailable`` and no database text."""
    await seed(engine, context_id=1, record_id=10, note=BEST)
    async with engine.connect() as conn:
        transaction = await conn.begin()
        await conn.execute(text("LOCK TABLE ai.context_embedding IN ACCESS EXCLUSIVE MODE"))
        try:
            pending = asyncio.create_task(search(worker))
            pid = await _search_backend_waiting_on_a_lock(engine)
            async with engine.connect() as admin:
                await admin.execute(text("SELECT pg_cancel_backend(:pid)"), {"pid": pid})
            response = await asyncio.wait_for(pending, timeout=10)
        finally:
            await transaction.rollback()

    assert response.status_code == 503
    assert response.json() == {"detail": "database unavailable"}
    assert response.headers["Retry-After"] == "5"


async def test_query_text_never_reaches_the_logs(engine, worker, fake_openai, caplog):
    """§6: neither a successful nor a failing (transient or permanent) search logs the query
    (our loggers at any level, every logger at INFO and above)."""
    await seed(engine, context_id=1, record_id=10, note=BEST)
    fake_openai.script_embeddings(
        Scripted(status=503), Scripted(json=embedding_body([np.zeros(DIMENSION)]))
    )

    assert (await search(worker)).status_code == 503
    assert (await search(worker)).status_code == 502
    assert (await search(worker)).status_code == 200

    logged = [
        r.getMessage() for r in caplog.records if r.name.startswith("app.") or r.levelno >= 20
    ]
    assert logged and all(QUERY not in message for message in logged)


# --------------------------------------------------------------------------- §8


async def test_s8_request_without_or_with_a_wrong_secret_is_401_without_embedding_call(
    engine, worker, fake_openai
):
    await seed(engine, context_id=1, record_id=10, note=BEST)

    missing = await search(worker, secret=None)
    wrong = await search(worker, secret=SECRET + "x")
    empty = await search(worker, secret="")

    assert [r.status_code for r in (missing, wrong, empty)] == [401, 401, 401]
    assert all("results" not in r.text for r in (missing, wrong, empty))
    assert fake_openai.embedding_calls == 0


VALID_BODY: dict[str, Any] = {"userId": 1, "query": QUERY, "limit": 5, "embeddingProfile": PROFILE}
MALFORMED: dict[str, tuple[dict[str, Any], str]] = {
    "userId_string": ({**VALID_BODY, "userId": "1"}, "userId"),
    "userId_zero": ({**VALID_BODY, "userId": 0}, "userId"),
    "userId_over_bigint": ({**VALID_BODY, "userId": 2**63}, "userId"),
    "limit_zero": ({**VALID_BODY, "limit": 0}, "limit"),
    "limit_101": ({**VALID_BODY, "limit": 101}, "limit"),
    "limit_true": ({**VALID_BODY, "limit": True}, "limit"),
    "limit_float": ({**VALID_BODY, "limit": 2.5}, "limit"),
    "embeddingProfile_missing": (
        {k: v for k, v in VALID_BODY.items() if k != "embeddingProfile"},
        "embeddingProfile",
    ),
    "query_null": ({**VALID_BODY, "query": None}, "query"),
    "query_missing": ({k: v for k, v in VALID_BODY.items() if k != "query"}, "query"),
    "query_number": ({**VALID_BODY, "query": 5}, "query"),
}


async def test_s8_malformed_bodies_are_422_naming_the_field_without_embedding_call(
    engine, worker, fake_openai
):
    """§8: each malformed body is 422 whose detail names exactly the failing field, and the
    rejected input is not echoed back; nothing reaches the provider. One worker for all."""
    await seed(engine, context_id=1, record_id=10, note=BEST)
    answers = {}
    for name, (body, _) in MALFORMED.items():
        response = await post_search(worker, body)
        locs = [error["loc"] for error in response.json()["detail"]]
        answers[name] = (response.status_code, locs, QUERY in response.text)

    expected = {name: (422, [["body", field]], False) for name, (_, field) in MALFORMED.items()}
    assert answers == expected
    assert fake_openai.embedding_calls == 0
    assert (await post_search(worker, VALID_BODY)).status_code == 200  # the control
