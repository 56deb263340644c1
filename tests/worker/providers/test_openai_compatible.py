"""OpenAI-compatible providers against a real local server (CONTRACT §4, §5, §6).

Cases: FC-01, FC-04, FC-05, FC-07, FC-08, FC-10.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import traceback
import unicodedata
from collections.abc import AsyncIterator

import numpy as np
import pytest

from app.errors import (
    InvalidOutputError,
    PermanentError,
    ProviderProtocolError,
    ProviderUnavailableError,
    TransientError,
)
from app.metrics import WorkerMetrics
from app.providers.base import JudgeCandidate, JudgeSelection, JudgeVerdict
from app.providers.factory import build_embedding_provider, build_judge
from app.providers.hashing import hash_embed
from app.providers.openai_compatible import OpenAIEmbedder, OpenAIJudge
from app.providers.usage import CollectingSink
from app.settings import Settings
from app.settings.profiles import openai_judge_profile
from tests.fake_openai import DEFAULT_DIMENSION, FakeOpenAI, Scripted, embedding_body, judge_body

API_KEY = "sk-test-do-not-leak-4242"
DIMENSION = DEFAULT_DIMENSION
UPSTREAM_SECRET = "upstream-detail-7f3a: internal stack trace"
CANDIDATES = (
    JudgeCandidate(12, "친구와", "COMPANION", "친구와 함께한 방문", ("친구랑 왔어요",), 0.61),
    JudgeCandidate(7, "조용한", "ATMOSPHERE", "조용하고 차분한 분위기", ("조용해요",), 0.55),
    JudgeCandidate(30, "작업하기 좋은", "ACTIVITY", "노트북 작업", ("카공",), 0.42),
)


def _vectors(count: int, dimension: int = DIMENSION) -> list[np.ndarray]:
    return [hash_embed(f"vector {i}", dimension) for i in range(count)]


@pytest.fixture
async def embedder(fake: FakeOpenAI) -> AsyncIterator[OpenAIEmbedder]:
    provider = _embedder_with(fake)
    yield provider
    await provider.aclose()


@pytest.fixture
def judge_metrics() -> WorkerMetrics:
    """The judge's own registry: its re-ask count starts at 0 in every test."""
    return WorkerMetrics()


@pytest.fixture
async def judge(fake: FakeOpenAI, judge_metrics: WorkerMetrics) -> AsyncIterator[OpenAIJudge]:
    provider = _judge_with(fake, max_retries=0, metrics=judge_metrics)
    yield provider
    await provider.aclose()


def _embedder_with(fake: FakeOpenAI | None, **overrides) -> OpenAIEmbedder:
    """An embedder of the fake (or of ``base_url``), defaults as the ``embedder`` fixture's."""
    values = {
        "base_url": fake.base_url if fake is not None else None,
        "api_key": API_KEY,
        "model": "text-embedding-3-small",
        "dimension": DIMENSION,
        "timeout_seconds": 5.0,
        "max_retries": 0,
    }
    values.update(overrides)
    return OpenAIEmbedder(**values)


def _judge_with(
    fake: FakeOpenAI, *, max_retries: int, metrics: WorkerMetrics | None = None
) -> OpenAIJudge:
    return OpenAIJudge(
        base_url=fake.base_url,
        api_key=API_KEY,
        model="gpt-4o-mini",
        profile="openai-chat-gpt-4o-mini-p2",
        timeout_seconds=5.0,
        max_retries=max_retries,
        metrics=metrics or WorkerMetrics(),
    )


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- embeddings -------------------------------------------------------------------------------


async def test_embed_sends_list_input_asking_for_base64_by_default(fake, embedder) -> None:
    vectors = await embedder.embed(["성수 카페", "한강 산책"])

    [request] = fake.embedding_requests
    assert request["input"] == ["성수 카페", "한강 산책"]
    assert request["encoding_format"] == "base64"
    assert request["model"] == "text-embedding-3-small"
    assert [v.tobytes() for v in vectors] == [
        hash_embed("성수 카페", DIMENSION).tobytes(),
        hash_embed("한강 산책", DIMENSION).tobytes(),
    ]
    assert all(v.dtype == np.float32 and v.shape == (DIMENSION,) for v in vectors)


async def test_embed_with_float_encoding_reads_the_same_vectors(fake) -> None:
    embedder = _embedder_with(fake, encoding="float")
    vectors = await embedder.embed(["성수 카페"])
    await embedder.aclose()

    [request] = fake.embedding_requests
    assert request["encoding_format"] == "float"
    assert vectors[0].tobytes() == hash_embed("성수 카페", DIMENSION).tobytes()


async def test_a_provider_answering_floats_to_a_base64_request_is_read(fake, embedder) -> None:
    """Providers that ignore ``encoding_format`` answer JSON numbers: read either way."""
    expected = hash_embed("메모", DIMENSION)
    fake.script_embeddings(Scripted(json=embedding_body([expected])))

    [vector] = await embedder.embed(["메모"])

    assert vector.tobytes() == expected.tobytes()


async def test_embed_batch_out_of_order_is_matched_by_index_fc05d(fake, embedder) -> None:
    expected = _vectors(3)
    body = embedding_body(expected)
    body["data"] = [body["data"][2], body["data"][0], body["data"][1]]
    fake.script_embeddings(Scripted(json=body))

    vectors = await embedder.embed(["a", "b", "c"])

    assert [v.tobytes() for v in vectors] == [v.tobytes() for v in expected]


async def test_embed_empty_data_is_protocol_error_fc05b(fake, embedder) -> None:
    fake.script_embeddings(Scripted(json={"object": "list", "data": []}))

    with pytest.raises(ProviderProtocolError, match="malformed body"):
        await embedder.embed(["메모"])


async def test_embed_index_one_for_one_input_is_protocol_error_fc05c(fake, embedder) -> None:
    body = embedding_body(_vectors(1))
    body["data"][0]["index"] = 1
    fake.script_embeddings(Scripted(json=body))

    with pytest.raises(ProviderProtocolError, match="bad index"):
        await embedder.embed(["메모"])


async def test_embed_missing_embedding_key_is_protocol_error_fc01(fake, embedder) -> None:
    payload = {"object": "list", "data": [{"index": 0, "object": "embedding"}]}
    fake.script_embeddings(Scripted(json=payload))

    with pytest.raises(ProviderProtocolError) as caught:
        await embedder.embed(["메모"])

    assert str(caught.value) == "embedding provider returned a malformed body: missing embedding"


_ONE = '{"index": 0, "embedding": [1.0]}'


@pytest.mark.parametrize(
    ("raw_body", "inputs", "reason"),
    [
        ("<html>bad gateway</html>", 1, "not JSON"),
        ('{"object": "list"}', 1, "missing data"),
        (f'{{"data": [{_ONE}]}}', 2, "wrong number of items"),
        ('{"data": [7]}', 1, "item is not an object"),
        ('{"data": [{"index": true, "embedding": [1.0]}]}', 1, "bad index"),
        (f'{{"data": [{_ONE}, {_ONE}]}}', 2, "bad index"),
        ('{"data": [{"index": 0, "embedding": ["1.0"]}]}', 1, "non-numeric embedding"),
        ('{"data": [{"index": 0, "embedding": [NaN]}]}', 1, "non-finite embedding"),
        ('{"data": [{"index": 0, "embedding": [1e39]}]}', 1, "non-finite embedding"),
        ('{"data": [{"index": 0, "embedding": "not base64!"}]}', 1, "invalid base64 embedding"),
        (
            '{"data": [{"index": 0, "embedding": "AAA="}]}',
            1,
            "base64 embedding is not float32 values",
        ),
        # float32 NaN and +inf, packed little-endian: 0x7fc00000, 0x7f800000
        ('{"data": [{"index": 0, "embedding": "AADAfw=="}]}', 1, "non-finite embedding"),
        ('{"data": [{"index": 0, "embedding": "AACAfw=="}]}', 1, "non-finite embedding"),
        ('{"data": [{"index": 0, "embedding": {"x": 1}}]}', 1, "missing embedding"),
    ],
)
async def test_embed_other_malformed_bodies_are_protocol_errors(
    fake, raw_body, inputs, reason
) -> None:
    embedder = _embedder_with(fake, model="m", dimension=1)
    fake.script_embeddings(Scripted(raw_body=raw_body))

    with pytest.raises(ProviderProtocolError) as caught:
        await embedder.embed(["text"] * inputs)
    await embedder.aclose()

    assert str(caught.value) == f"embedding provider returned a malformed body: {reason}"


@pytest.mark.parametrize("encoding", ["base64", "float"])
async def test_embed_wrong_dimension_is_permanent_naming_both_fc05a(fake, encoding) -> None:
    embedder = _embedder_with(fake, model="m", encoding=encoding)
    fake.set_embedding_dimension(1024)

    with pytest.raises(PermanentError) as caught:
        await embedder.embed(["메모"])
    await embedder.aclose()

    assert not isinstance(caught.value, TransientError)
    assert "1536" in str(caught.value)
    assert "1024" in str(caught.value)


async def test_embed_zero_vector_is_permanent_fc04(fake, embedder) -> None:
    fake.script_embeddings(Scripted(json=embedding_body([[0.0] * DIMENSION])))

    with pytest.raises(PermanentError, match="zero vector"):
        await embedder.embed(["메모"])


async def test_embed_503_is_transient_without_upstream_body_or_key(fake, embedder) -> None:
    fake.script_embeddings(
        Scripted(status=503, json={"error": {"message": UPSTREAM_SECRET, "type": "server"}})
    )

    with pytest.raises(TransientError) as caught:
        await embedder.embed(["메모"])

    rendered = "".join(traceback.format_exception(caught.value))
    assert str(caught.value) == "embedding upstream 503"
    assert UPSTREAM_SECRET not in rendered
    assert API_KEY not in rendered
    assert fake.base_url not in rendered


@pytest.mark.parametrize(
    ("status", "error_class"),
    [
        (400, ProviderUnavailableError),
        (401, ProviderUnavailableError),
        (403, ProviderUnavailableError),
        (404, ProviderUnavailableError),
        (422, ProviderUnavailableError),
        (408, TransientError),
        (409, TransientError),
        (429, TransientError),
        (500, TransientError),
        (503, TransientError),
    ],
)
async def test_embed_status_is_mapped_per_section_6(fake, embedder, status, error_class) -> None:
    """A 4xx with no code and no param is provider-wide (never a verdict on the note);
    the full table is ``test_provider_answer_classes.py``."""
    fake.script_embeddings(Scripted(status=status, json={"error": {"message": UPSTREAM_SECRET}}))

    with pytest.raises(error_class) as caught:
        await embedder.embed(["메모"])

    assert type(caught.value) is error_class
    assert str(caught.value).startswith(f"embedding upstream {status}")
    assert UPSTREAM_SECRET not in str(caught.value)


async def test_embed_timeout_is_transient(fake) -> None:
    embedder = _embedder_with(fake, model="m", timeout_seconds=0.2)
    fake.script_embeddings(Scripted(delay_seconds=1.0))

    with pytest.raises(TransientError, match="embedding upstream timeout"):
        await embedder.embed(["메모"])
    await embedder.aclose()


async def test_embed_connection_refused_is_transient() -> None:
    embedder = _embedder_with(
        None, base_url=f"http://127.0.0.1:{_unused_port()}/v1", model="m", timeout_seconds=2.0
    )

    with pytest.raises(TransientError, match="embedding upstream unreachable"):
        await embedder.embed(["메모"])
    await embedder.aclose()


@pytest.mark.parametrize(
    "text",
    [
        unicodedata.normalize("NFC", "성수동 카페, 친구와 ☕ latte 🍜"),
        unicodedata.normalize("NFD", "성수동 카페, 친구와 ☕ latte 🍜"),
    ],
    ids=["nfc", "nfd"],
)
async def test_text_reaches_server_byte_identical_fc10(fake, embedder, judge, text) -> None:
    await embedder.embed([text])
    await judge.judge(text, CANDIDATES)

    [embedding_request] = fake.embedding_requests
    [judge_request] = fake.judge_requests
    note = json.loads(judge_request["messages"][1]["content"])["note"]
    assert embedding_request["input"][0].encode("utf-8") == text.encode("utf-8")
    assert note.encode("utf-8") == text.encode("utf-8")


# --- judge ------------------------------------------------------------------------------------


async def test_judge_request_carries_strict_schema_with_candidate_enum(fake, judge) -> None:
    await judge.judge("친구랑 조용한 카페", CANDIDATES)

    [request] = fake.judge_requests
    response_format = request["response_format"]
    schema = response_format["json_schema"]["schema"]
    selection = schema["properties"]["selected"]["items"]
    assert request["model"] == "gpt-4o-mini"
    assert request["temperature"] == 0
    assert response_format["type"] == "json_schema"
    assert response_format["json_schema"]["name"] == "keyword_judgment"
    assert response_format["json_schema"]["strict"] is True
    assert schema["required"] == ["selected", "unmatchedConcepts"]
    assert schema["additionalProperties"] is False
    assert selection["properties"]["keywordId"] == {"type": "integer", "enum": [12, 7, 30]}
    assert selection["required"] == ["keywordId", "confidence"]
    assert selection["additionalProperties"] is False
    assert schema["properties"]["unmatchedConcepts"]["items"] == {"type": "string"}


async def test_judge_prompt_carries_only_candidate_fields(fake, judge) -> None:
    await judge.judge("친구랑 조용한 카페", CANDIDATES[:1])

    [request] = fake.judge_requests
    assert [m["role"] for m in request["messages"]] == ["system", "user"]
    user = json.loads(request["messages"][1]["content"])
    assert user == {
        "note": "친구랑 조용한 카페",
        "candidates": [
            {
                "id": 12,
                "display_name": "친구와",
                "category": "COMPANION",
                "description": "친구와 함께한 방문",
                "examples": ["친구랑 왔어요"],
            }
        ],
    }


async def test_judge_instructions_ask_for_every_supported_label_not_only_the_strongest(
    fake, judge
) -> None:
    """Prompt p2 (issue 32): the system message sent asks for every candidate the note
    supports and says a denied cue is no support; the profile names that revision."""
    await judge.judge("친구랑 조용한 카페", CANDIDATES)

    [request] = fake.judge_requests
    system = request["messages"][0]["content"]
    assert "Select every candidate the note supports, not only the strongest" in system
    assert "A cue the note denies or complains about is no support" in system
    assert openai_judge_profile("gpt-4o-mini") == "openai-chat-gpt-4o-mini-p2"


async def test_judge_parses_default_structured_answer(judge) -> None:
    verdict = await judge.judge("친구랑 조용한 카페", CANDIDATES)

    assert verdict == JudgeVerdict(selected=(JudgeSelection(12, 0.9),), unmatched_concepts=())


async def test_judge_returns_out_of_candidate_ids_and_confidences_raw(fake, judge) -> None:
    fake.script_judge(
        Scripted(json=judge_body([(999, 1.7), (12, -0.2), (12, 0.4)], unmatched=["루프탑"]))
    )

    verdict = await judge.judge("메모", CANDIDATES)

    assert verdict == JudgeVerdict(
        selected=(JudgeSelection(999, 1.7), JudgeSelection(12, -0.2), JudgeSelection(12, 0.4)),
        unmatched_concepts=("루프탑",),
    )


async def test_judge_refusal_is_permanent_fc08b(fake, judge) -> None:
    fake.script_judge(Scripted(json=judge_body([], refusal="I can't help with that.")))

    with pytest.raises(PermanentError, match=r"^judge refused$"):
        await judge.judge("메모", CANDIDATES)


@pytest.mark.parametrize(
    "content",
    ['{"selected":[{"keywordId":102,"confid', '{"selected": [], "unmatchedConcepts": []}'],
    ids=["cut-off-fc08a", "parses-anyway-fc08c"],
)
async def test_judge_truncation_is_permanent_even_when_it_parses(fake, judge, content) -> None:
    fake.script_judge(Scripted(json=judge_body([], finish_reason="length", raw_content=content)))

    with pytest.raises(PermanentError, match=r"^judge output truncated$"):
        await judge.judge("메모", CANDIDATES)


INVALID_STRUCTURE = [
    "not json",
    "[]",
    '{"selected": []}',
    '{"selected": {}, "unmatchedConcepts": []}',
    "Sure! Here are the keywords: 12",
    None,  # content null without a refusal
]


def _reasks(metrics: WorkerMetrics) -> float | None:
    return metrics.registry.get_sample_value("pinlog_judge_reasks_total")


@pytest.mark.parametrize("content", INVALID_STRUCTURE)
async def test_judge_output_without_usable_structure_is_asked_again_once_then_invalid(
    fake, judge, judge_metrics, content
) -> None:
    """§6 "still invalid after retries": one re-ask, then ``InvalidOutputError``
    (permanent); the re-ask repeats the note and candidates plus a reminder, not the answer."""
    for _ in range(2):
        body = judge_body([], raw_content=content if content is not None else "")
        body["choices"][0]["message"]["content"] = content
        fake.script_judge(Scripted(json=body))

    with pytest.raises(InvalidOutputError, match=r"^judge output invalid$"):
        await judge.judge("메모", CANDIDATES)

    assert fake.judge_calls == 2
    assert _reasks(judge_metrics) == 1
    first, second = fake.judge_requests
    assert second["messages"][:2] == first["messages"]
    assert second["messages"][2]["role"] == "user"
    assert "JSON object" in second["messages"][2]["content"]


async def test_judge_invalid_then_valid_answer_returns_the_valid_one(
    fake, judge, judge_metrics
) -> None:
    fake.script_judge(Scripted(json=judge_body([], raw_content="not json")))

    verdict = await judge.judge("메모", CANDIDATES)

    assert verdict.selected == (JudgeSelection(12, 0.9),)
    assert fake.judge_calls == 2
    assert _reasks(judge_metrics) == 1


ANSWER = '{"selected": [{"keywordId": 12, "confidence": 0.9}], "unmatchedConcepts": []}'


@pytest.mark.parametrize(
    "content",
    [
        f"```json\n{ANSWER}\n```",
        f"\n```\n{ANSWER}```\n",
    ],
    ids=["json-fence", "bare-fence"],
)
async def test_judge_answer_in_a_markdown_code_fence_is_read_without_a_reask(
    fake, judge, judge_metrics, content
) -> None:
    fake.script_judge(Scripted(json=judge_body([], raw_content=content)))

    verdict = await judge.judge("메모", CANDIDATES)

    assert verdict.selected == (JudgeSelection(12, 0.9),)
    assert fake.judge_calls == 1
    assert _reasks(judge_metrics) == 0


@pytest.mark.parametrize(
    ("content", "item"),
    [
        ('{"selected": [{"keywordId": true, "confidence": 0.5}]', JudgeSelection(True, 0.5)),
        ('{"selected": [{"keywordId": "12", "confidence": 0.5}]', JudgeSelection("12", 0.5)),
        ('{"selected": [{"keywordId": 12.0, "confidence": 0.5}]', JudgeSelection(12.0, 0.5)),
        ('{"selected": [{"keywordId": 12, "confidence": "0.5"}]', JudgeSelection(12, "0.5")),
        ('{"selected": [{"keywordId": 12}]', JudgeSelection(12, None)),
        ('{"selected": [12]', 12),
    ],
)
async def test_judge_returns_malformed_items_raw_for_the_item_level_mapping(
    fake, judge, content, item
) -> None:
    """Issue 7 item 3: a malformed item does not make the answer invalid; it is passed on
    uncoerced, and ``service/judgment.py`` drops it alone."""
    raw = content + ', "unmatchedConcepts": ["루프탑", 3]}'
    fake.script_judge(Scripted(json=judge_body([], raw_content=raw)))

    verdict = await judge.judge("메모", CANDIDATES)

    assert verdict.selected == (item,)
    assert verdict.unmatched_concepts == ("루프탑", 3)
    assert fake.judge_calls == 1


async def test_judge_body_without_choices_is_protocol_error(fake, judge) -> None:
    fake.script_judge(Scripted(json={"object": "chat.completion", "choices": []}))

    with pytest.raises(ProviderProtocolError, match="judge provider returned a malformed body"):
        await judge.judge("메모", CANDIDATES)


async def test_judge_401_is_provider_wide_without_upstream_body(fake, judge) -> None:
    fake.script_judge(Scripted(status=401, json={"error": {"message": UPSTREAM_SECRET}}))

    with pytest.raises(ProviderUnavailableError) as caught:
        await judge.judge("메모", CANDIDATES)

    assert str(caught.value) == "judge upstream 401: provider-wide (authentication)"
    assert UPSTREAM_SECRET not in "".join(traceback.format_exception(caught.value))


async def test_judge_without_candidates_makes_no_call(fake, judge) -> None:
    verdict = await judge.judge("메모", [])

    assert verdict == JudgeVerdict(selected=(), unmatched_concepts=())
    assert fake.judge_calls == 0


async def test_judge_honours_short_retry_after_within_one_call_fc07a(fake) -> None:
    judge = _judge_with(fake, max_retries=2)
    too_many = {"error": {"message": "slow down"}}
    fake.script_judge(
        Scripted(status=429, json=too_many, headers={"Retry-After": "0.2"}),
        Scripted(status=429, json=too_many, headers={"Retry-After": "0.2"}),
    )
    started = time.monotonic()

    verdict = await judge.judge("메모", CANDIDATES)

    assert time.monotonic() - started >= 0.4
    assert fake.judge_calls == 3
    assert verdict.selected == (JudgeSelection(12, 0.9),)
    await judge.aclose()


async def test_judge_gives_up_at_once_on_long_retry_after_fc07b(fake) -> None:
    judge = _judge_with(fake, max_retries=2)
    too_many = Scripted(status=429, json={"error": {}}, headers={"Retry-After": "600"})
    fake.script_judge(too_many, too_many, too_many)
    started = time.monotonic()

    with pytest.raises(TransientError, match=r"^judge upstream 429 \(retry-after 600 s\)$"):
        await judge.judge("메모", CANDIDATES)

    assert time.monotonic() - started < 2
    assert fake.judge_calls == 1
    await judge.aclose()


# --- construction and the fake server's race controls ------------------------------------------


async def test_factory_builds_openai_providers_from_settings(fake) -> None:
    settings = Settings(
        database_url="postgresql+asyncpg://u:p@localhost/db",
        internal_secret="provider-test-internal-secret-0123456789",
        embedding_base_url=fake.base_url,
        embedding_api_key=API_KEY,
        judge_base_url=fake.base_url,
        judge_api_key=API_KEY,
        provider_max_retries=0,
    )
    embedder = build_embedding_provider(settings)
    judge = build_judge(settings, WorkerMetrics())

    [vector] = await embedder.embed(["메모"])
    verdict = await judge.judge("메모", CANDIDATES)

    assert isinstance(embedder, OpenAIEmbedder)
    assert isinstance(judge, OpenAIJudge)
    assert vector.shape == (settings.embedding_dimension,)
    assert judge.profile == settings.judge_profile == f"openai-chat-{settings.judge_model}-p2"
    assert verdict.selected == (JudgeSelection(12, 0.9),)
    await embedder.aclose()
    await judge.aclose()


async def test_fake_server_holds_a_blocked_call_in_flight_until_released(fake, embedder) -> None:
    release = threading.Event()
    held = Scripted(block=release)
    fake.script_embeddings(held)

    task = asyncio.create_task(embedder.embed(["메모"]))
    assert await asyncio.to_thread(held.entered.wait, 5)
    await asyncio.sleep(0.05)
    assert not task.done()
    release.set()
    [vector] = await asyncio.wait_for(task, 5)

    assert vector.tobytes() == hash_embed("메모", DIMENSION).tobytes()
    assert fake.embedding_calls == 1


# A note whose judge prompt passes the 1,024-token caching threshold (about 4 chars a token).
LONG_NOTE = "창가 자리가 넓고 조용해서 혼자 책 읽기 좋은 카페였다. " * 160


async def test_a_repeated_long_prompt_reports_cached_tokens_in_openais_steps(
    fake: FakeOpenAI, judge: OpenAIJudge
) -> None:
    """The fake provider's prompt cache as OpenAI reports it, read by the judge's usage: the
    second identical request's prefix is cached from 1,024 tokens in steps of 128."""
    sink = CollectingSink()
    judge.usage = sink
    await judge.judge(LONG_NOTE, CANDIDATES)
    await judge.judge(LONG_NOTE, CANDIDATES)

    first, second = (usage for _, usage in sink.calls)
    assert first.cached_prompt_tokens == 0
    assert second.prompt_tokens == first.prompt_tokens > 1024
    # The whole prompt but its last partial step of 128 tokens.
    assert second.cached_prompt_tokens == 1024 + (second.prompt_tokens - 1024) // 128 * 128


async def test_candidates_that_differ_share_no_cached_prefix_with_the_schema_first(
    fake: FakeOpenAI, judge: OpenAIJudge
) -> None:
    """The structured output schema comes before the messages in OpenAI's cache order, and its
    enum holds the note's candidate ids: the same long note with other candidates is not
    cached (why the judge's layout cannot gain from the cache, docs/offline-encoder.md)."""
    sink = CollectingSink()
    judge.usage = sink
    await judge.judge(LONG_NOTE, CANDIDATES)
    await judge.judge(LONG_NOTE, CANDIDATES[::-1])

    assert [usage.cached_prompt_tokens for _, usage in sink.calls] == [0, 0]
    fake.set_prompt_cache(False)
    await judge.judge(LONG_NOTE, CANDIDATES)
    await judge.judge(LONG_NOTE, CANDIDATES)
    assert sink.calls[-1][1].cached_prompt_tokens == 0
