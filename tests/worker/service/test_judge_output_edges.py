"""Untrusted judge and embedding answers (CONTRACT §4, §6, FC-05, FC-08).

The judge is an untrusted upstream: whatever it returns must end as a stored mapping (§4:
unknown ids and out-of-range confidences discarded), a permanent "invalid output" (§6), or a
transient fault; never a crash classified as a bug of ours, never a DB error, never a log line
carrying model output.
"""

from __future__ import annotations

import json
import logging

from tests.fake_openai import Scripted, candidate_ids, judge_body
from tests.worker.support import (
    app_records,
    count_rows,
    fetch_state,
    keyword_rows,
    make_state,
    stored_analysis,
)

NOTE = "노트북 들고 공부하기 좋은 조용한 카페. 콘센트 많음."


def _offered(fake_openai) -> list[int]:
    return candidate_ids(fake_openai.judge_requests[-1])


def _unexpected(caplog) -> list[logging.LogRecord]:
    return [r for r in app_records(caplog, logging.ERROR) if "unexpected" in r.getMessage()]


async def test_confidence_as_a_huge_json_integer_is_discarded_not_a_crash(
    engine, worker, fake_openai, caplog
):
    """§4: a confidence outside 0..1 discards that item, including a JSON integer too large
    for a float (``10**400``); the other items are stored and the stage completes."""
    fake_openai.set_judge_selection(
        lambda ids: [{"keywordId": ids[0], "confidence": 10**400}, (ids[1], 0.7)]
    )
    await make_state(engine, context_id=1)

    await worker.process(1, NOTE)

    offered = _offered(fake_openai)
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert {k: c for k, (c, _) in (await keyword_rows(engine, 1)).items()} == {offered[1]: 0.7}
    assert not _unexpected(caplog)


async def test_deeply_nested_judge_content_is_invalid_output_not_a_bug(
    engine, worker, fake_openai, caplog
):
    """§6, FC-08: judge content nested too deeply to parse is invalid structured output:
    asked again once, then permanent, keyword ``FAILED``, never an unexpected error of ours."""
    nested = '{"selected": [], "unmatchedConcepts": ' + "[" * 100_000 + "]" * 100_000 + "}"
    fake_openai.script_judge(*(Scripted(json=judge_body([], raw_content=nested)) for _ in "ab"))
    await make_state(engine, context_id=1)

    await worker.process(1, NOTE)

    assert await fetch_state(engine, 1) == ("COMPLETED", "FAILED")
    assert fake_openai.judge_calls == 2
    assert not _unexpected(caplog)


async def test_deeply_nested_embedding_body_is_a_provider_protocol_fault_not_a_bug(
    engine, worker, fake_openai, caplog
):
    """FC-05, §6: a 2xx embedding body nested too deeply to parse is a provider protocol
    fault: transient (left ``PROCESSING``), nothing stored, judge not called, logged as such."""
    nested = '{"object": "list", "data": ' + "[" * 100_000 + "]" * 100_000 + "}"
    fake_openai.script_embeddings(Scripted(raw_body=nested))
    await make_state(engine, context_id=1)

    await worker.process(1, NOTE)

    assert await fetch_state(engine, 1) == ("PROCESSING", "PENDING")
    assert await count_rows(engine, "ai.context_embedding", 1) == 0
    assert fake_openai.judge_calls == 0
    assert not _unexpected(caplog)
    assert any("protocol fault" in r.getMessage() for r in app_records(caplog, logging.ERROR))


async def test_out_of_range_and_oversized_keyword_ids_are_discarded_without_db_errors(
    engine, worker, fake_openai, caplog
):
    """§4: ids outside the candidates (beyond int4, negative, zero) are discarded before SQL;
    NaN/Infinity confidences are dropped, never clamped; no DB error is logged."""
    fake_openai.set_judge_selection(
        lambda ids: [
            (2**31, 0.9),
            (2**63, 0.9),
            (-ids[0], 0.9),
            (0, 0.9),
            (ids[0], 0.6),
            (ids[1], float("nan")),  # json.dumps writes the NaN token
            (ids[2], float("inf")),
            (ids[3], float("-inf")),
        ]
    )
    await make_state(engine, context_id=1)

    await worker.process(1, NOTE)

    offered = _offered(fake_openai)
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert {k: c for k, (c, _) in (await keyword_rows(engine, 1)).items()} == {offered[0]: 0.6}
    assert not app_records(caplog, logging.ERROR)


async def test_keyword_id_as_float_or_bool_is_dropped_alone_and_the_stage_completes(
    engine, worker, fake_openai, caplog
):
    """§4: a ``keywordId`` of ``3.0`` or ``true`` is never coerced into an id:
    that item is dropped by itself, the valid item beside it is stored, the stage completes."""
    await make_state(engine, context_id=1)
    await make_state(engine, context_id=2)
    fake_openai.set_judge_selection(
        lambda ids: [{"keywordId": float(ids[0]), "confidence": 0.5}, (ids[1], 0.7)]
    )
    await worker.process(1, NOTE)
    fake_openai.set_judge_selection(
        lambda ids: [{"keywordId": True, "confidence": 0.5}, (ids[1], 0.7)]
    )
    await worker.process(2, NOTE)

    offered = _offered(fake_openai)
    for context_id in (1, 2):
        assert await fetch_state(engine, context_id) == ("COMPLETED", "COMPLETED")
        assert set(await keyword_rows(engine, context_id)) == {offered[1]}
        assert await count_rows(engine, "ai.context_keyword_analysis", context_id) == 1
    assert fake_openai.judge_calls == 2
    assert not _unexpected(caplog)
    dropped = [
        r.getMessage() for r in app_records(caplog, logging.INFO) if "dropped" in r.getMessage()
    ]
    assert dropped == [
        "judge items dropped: context_id=1 id_not_an_integer=1",
        "judge items dropped: context_id=2 id_not_an_integer=1",
    ]


async def test_confidence_rounding_into_numeric_4_3_never_breaks_the_check(
    engine, worker, fake_openai
):
    """§1 ``NUMERIC(4,3) CHECK (0..1)``: in-range confidences round into the check (0.9995 ->
    1.000, many decimals -> 3, a denormal -> 0) and the stage completes."""
    fake_openai.set_judge_selection(
        lambda ids: [
            (ids[0], 0.9995),
            (ids[1], 0.99999999999),
            (ids[2], 0.123456789012345678),
            (ids[3], 5e-324),
            (ids[4], 0.0005),
        ]
    )
    await make_state(engine, context_id=1)

    await worker.process(1, NOTE)

    offered = _offered(fake_openai)
    stored = {k: c for k, (c, _) in (await keyword_rows(engine, 1)).items()}
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert stored[offered[0]] == 1.0
    assert stored[offered[1]] == 1.0
    assert stored[offered[2]] == 0.123
    assert stored[offered[3]] == 0.0
    assert 0.0 <= stored[offered[4]] <= 0.001


async def test_hostile_unmatched_concepts_are_cleaned_and_stored_as_jsonb(
    engine, worker, fake_openai
):
    """§4: ``unmatchedConcepts`` are stored as jsonb without ``\\u0000`` or lone surrogates:
    printable, de-duplicated, at most 20 items of at most 100 chars."""
    concepts = ["a\u0000b", "\ud800", "\u2028", "x" * 100_000, "a\u0000b", "ok"] + [
        f"c{i}" for i in range(5000)
    ]

    def answer(ids: list[int]) -> str:
        return json.dumps({"selected": [], "unmatchedConcepts": concepts})  # ASCII escapes

    held = Scripted()
    fake_openai.script_judge(held)
    await make_state(engine, context_id=1)
    held.json = judge_body([], raw_content=answer([]))

    await worker.process(1, NOTE)

    analysis = await stored_analysis(engine, 1)
    assert await fetch_state(engine, 1) == ("COMPLETED", "COMPLETED")
    assert analysis is not None
    assert analysis.unmatched_concepts[:3] == ["ab", "x" * 100, "ok"]
    assert len(analysis.unmatched_concepts) == 20
