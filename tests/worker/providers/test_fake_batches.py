"""The fake provider's Batch API over HTTP (``tests/fake_openai_batches.py``): what later batch
work (issue 34 item 1) is tested against, in OpenAI's shapes: files, a batch's status
transitions, output and error files, per-item errors, expiry and cancel."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx
import pytest

from app.providers import openai_wire
from tests.fake_openai import FakeOpenAI, error_body

LONG_NOTE = "창가 자리가 넓고 조용해서 혼자 책 읽기 좋은 카페였다. " * 160


@pytest.fixture
async def client(fake: FakeOpenAI) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=fake.base_url, timeout=10) as http:
        yield http


def _chat_line(custom_id: str, note: str, ids: list[int]) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "gpt-4o-mini",
            "messages": [{"role": "system", "content": "judge"}, {"role": "user", "content": note}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "k", "strict": True,
                                "schema": openai_wire.judgment_schema(ids)},
            },
        },
    }  # fmt: skip


async def _upload(client: httpx.AsyncClient, lines: list[dict], purpose: str = "batch") -> dict:
    content = "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)
    answer = await client.post(
        "files",
        data={"purpose": purpose},
        files={"file": ("input.jsonl", content.encode(), "application/jsonl")},
    )
    return {"status": answer.status_code, **answer.json()}


async def _batch(client: httpx.AsyncClient, lines: list[dict], endpoint: str) -> dict:
    file = await _upload(client, lines)
    created = await client.post(
        "batches",
        json={"input_file_id": file["id"], "endpoint": endpoint, "completion_window": "24h"},
    )
    assert created.status_code == 200
    return created.json()


async def _poll(client: httpx.AsyncClient, batch_id: str) -> dict:
    answer = await client.get(f"batches/{batch_id}")
    assert answer.status_code == 200
    return answer.json()


async def _lines(client: httpx.AsyncClient, file_id: str | None) -> dict[str, dict]:
    if file_id is None:
        return {}
    content = (await client.get(f"files/{file_id}/content")).text
    return {item["custom_id"]: item for item in map(json.loads, content.splitlines())}


async def test_a_batch_moves_validating_in_progress_finalizing_completed_with_its_output(
    fake: FakeOpenAI, client: httpx.AsyncClient
) -> None:
    lines = [_chat_line("ctx-1", "조용한 카페", [3, 7]), _chat_line("ctx-2", "친구랑", [12])]
    created = await _batch(client, lines, "/v1/chat/completions")
    assert created["status"] == "validating" and created["object"] == "batch"
    assert created["expires_at"] - created["created_at"] == 24 * 3600

    statuses = [(await _poll(client, created["id"]))["status"] for _ in range(4)]

    assert statuses == ["in_progress", "finalizing", "completed", "completed"]
    done = await _poll(client, created["id"])
    assert done["request_counts"] == {"total": 2, "completed": 2, "failed": 0}
    assert done["error_file_id"] is None and done["completed_at"] is not None
    output = await _lines(client, done["output_file_id"])
    assert set(output) == {"ctx-1", "ctx-2"}
    answer = output["ctx-2"]["response"]
    assert answer["status_code"] == 200 and output["ctx-2"]["error"] is None
    verdict = json.loads(answer["body"]["choices"][0]["message"]["content"])
    assert verdict["selected"] == [{"keywordId": 12, "confidence": 0.9}]
    usage = answer["body"]["usage"]
    assert usage["prompt_tokens"] > 0 and usage["prompt_tokens_details"] == {"cached_tokens": 0}


async def test_embedding_lines_and_cached_tokens_of_repeated_prefixes_in_a_batch(
    fake: FakeOpenAI, client: httpx.AsyncClient
) -> None:
    lines = [
        {"custom_id": "e-1", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "text-embedding-3-small", "input": ["조용한 카페"]}},
    ]  # fmt: skip
    embedded = await _batch(client, lines, "/v1/embeddings")
    judged = await _batch(
        client,
        [_chat_line("j-1", LONG_NOTE, [1, 2]), _chat_line("j-2", LONG_NOTE, [1, 2])],
        "/v1/chat/completions",
    )
    for _ in range(3):
        embedding = await _poll(client, embedded["id"])
        judgment = await _poll(client, judged["id"])

    vectors = (await _lines(client, embedding["output_file_id"]))["e-1"]["response"]["body"]
    assert len(vectors["data"]) == 1 and vectors["usage"]["prompt_tokens"] > 0
    output = await _lines(client, judgment["output_file_id"])
    cached = [output[c]["response"]["body"]["usage"]["prompt_tokens_details"] for c in output]
    assert cached[0] == {"cached_tokens": 0} and cached[1]["cached_tokens"] >= 1024


async def test_per_item_errors_go_to_the_error_file_and_the_rest_completes(
    fake: FakeOpenAI, client: httpx.AsyncClient
) -> None:
    fake.batches.fail_custom_ids(
        {"ctx-2": (429, error_body("rate limited", type="requests", code="rate_limit_exceeded")),
         "ctx-3": (400, error_body("bad input", param="messages"))}
    )  # fmt: skip
    lines = [_chat_line(f"ctx-{n}", "메모", [n]) for n in (1, 2, 3)]
    created = await _batch(client, lines, "/v1/chat/completions")
    for _ in range(3):
        done = await _poll(client, created["id"])

    assert done["status"] == "completed"
    assert done["request_counts"] == {"total": 3, "completed": 1, "failed": 2}
    assert set(await _lines(client, done["output_file_id"])) == {"ctx-1"}
    errors = await _lines(client, done["error_file_id"])
    assert {c: e["response"]["status_code"] for c, e in errors.items()} == {
        "ctx-2": 429,
        "ctx-3": 400,
    }
    assert errors["ctx-2"]["response"]["body"]["error"]["code"] == "rate_limit_exceeded"


async def test_a_file_with_bad_lines_fails_the_batch_naming_the_lines(
    fake: FakeOpenAI, client: httpx.AsyncClient
) -> None:
    good = _chat_line("ctx-1", "메모", [1])
    wrong_url = {**_chat_line("ctx-2", "메모", [1]), "url": "/v1/embeddings"}
    created = await _batch(client, [good, good, wrong_url], "/v1/chat/completions")

    failed = await _poll(client, created["id"])

    assert failed["status"] == "failed" and failed["failed_at"] is not None
    assert [(e["code"], e["line"]) for e in failed["errors"]["data"]] == [
        ("duplicate_custom_id", 2),
        ("mismatched_endpoint", 3),
    ]
    assert failed["output_file_id"] is None


async def test_a_held_batch_stays_in_progress_then_expires_with_the_rest_in_the_error_file(
    fake: FakeOpenAI, client: httpx.AsyncClient
) -> None:
    fake.batches.hold_batches(True)
    lines = [_chat_line(f"ctx-{n}", "메모", [n]) for n in (1, 2, 3)]
    created = await _batch(client, lines, "/v1/chat/completions")
    statuses = [(await _poll(client, created["id"]))["status"] for _ in range(5)]
    assert statuses == ["in_progress"] * 5

    fake.batches.expire_batch(created["id"], completed=1)
    expired = await _poll(client, created["id"])

    assert expired["status"] == "expired" and expired["expired_at"] is not None
    assert expired["request_counts"] == {"total": 3, "completed": 1, "failed": 2}
    assert set(await _lines(client, expired["output_file_id"])) == {"ctx-1"}
    errors = await _lines(client, expired["error_file_id"])
    assert {c: (e["response"], e["error"]["code"]) for c, e in errors.items()} == {
        "ctx-2": (None, "batch_expired"),
        "ctx-3": (None, "batch_expired"),
    }
    with pytest.raises(ValueError, match="expired"):
        fake.batches.expire_batch(created["id"])


async def test_cancel_goes_through_cancelling_to_cancelled_and_a_finished_batch_refuses(
    fake: FakeOpenAI, client: httpx.AsyncClient
) -> None:
    fake.batches.hold_batches(True)
    created = await _batch(client, [_chat_line("ctx-1", "메모", [1])], "/v1/chat/completions")
    await _poll(client, created["id"])

    cancelling = await client.post(f"batches/{created['id']}/cancel")
    assert cancelling.status_code == 200 and cancelling.json()["status"] == "cancelling"
    cancelled = await _poll(client, created["id"])

    assert cancelled["status"] == "cancelled" and cancelled["cancelled_at"] is not None
    assert cancelled["request_counts"]["completed"] == 0
    assert cancelled["output_file_id"] is None
    again = await client.post(f"batches/{created['id']}/cancel")
    assert again.status_code == 409


async def test_bad_file_and_batch_requests_are_refused_like_openais(
    fake: FakeOpenAI, client: httpx.AsyncClient
) -> None:
    wrong_purpose = await _upload(client, [_chat_line("c", "n", [1])], purpose="fine-tune")
    assert wrong_purpose["status"] == 400 and wrong_purpose["error"]["param"] == "purpose"
    unknown_file = await client.post(
        "batches",
        json={"input_file_id": "file-404", "endpoint": "/v1/chat/completions",
              "completion_window": "24h"},
    )  # fmt: skip
    assert unknown_file.status_code == 400
    file = await _upload(client, [_chat_line("c", "n", [1])])
    for field, value in (("endpoint", "/v1/completions"), ("completion_window", "1h")):
        body = {"input_file_id": file["id"], "endpoint": "/v1/chat/completions",
                "completion_window": "24h", field: value}  # fmt: skip
        refused = await client.post("batches", json=body)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == field
    assert (await client.get("batches/batch_404")).status_code == 404
    assert (await client.get(f"files/{file['id']}")).json()["purpose"] == "batch"
    assert (await client.delete(f"files/{file['id']}")).json()["deleted"] is True
    assert (await client.get(f"files/{file['id']}/content")).status_code == 404
