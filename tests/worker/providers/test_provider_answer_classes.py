"""Every provider answer falls in one class (docs/failures.md "Provider answers"):
one test per row of ``failure_policy.status_error``, against the fake provider speaking the
exact body that the row's source reports, through both providers.

Classes: *input* (``InvalidInputError`` with a failure reason: that note only), *provider-wide*
(``ProviderUnavailableError`` with a reason label: left for a later attempt, the gate counts
it), *transient* (``TransientError``). Input and provider-wide answers are never retried inside
the call (the same request gets the same answer); transient ones are.
"""

from __future__ import annotations

import traceback
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from app.errors import InvalidInputError, ProviderUnavailableError, TransientError
from app.metrics import WorkerMetrics
from app.providers.base import JudgeCandidate
from app.providers.openai_compatible import OpenAIEmbedder, OpenAIJudge
from tests.fake_openai import DEFAULT_DIMENSION, FakeOpenAI, Scripted, error_body

API_KEY = "sk-test-do-not-leak-4242"
CANDIDATES = (JudgeCandidate(12, "친구와", "COMPANION", "친구와 함께한 방문", ("친구랑",), 0.6),)
RETRIES = 2  # each call may retry twice: only transient rows use it


@dataclass(frozen=True)
class Row:
    """One row: ``status`` and ``body`` as the source shows them; the expected class and its
    reason (a ``FailureReason`` value for input, a gate reason label for provider-wide)."""

    source: str
    status: int
    body: Any
    expected: type[Exception]
    reason: str | None = None
    layers: tuple[str, ...] = ("embedding", "judge")


ROWS = {
    # --- input: this note only ----------------------------------------------------------------
    "context-length": Row(
        "OpenAI: maximum context length exceeded (chat and embeddings)",
        400,
        error_body(
            "This model's maximum context length is 8192 tokens, however you requested 9000",
            param="messages",
            code="context_length_exceeded",
        ),
        InvalidInputError,
        "input_too_long",
    ),
    "string-above-max-length": Row(
        "OpenAI: an input string over the maximum length (the code wins over param)",
        400,
        error_body(
            "Invalid 'input[0]': string too long.",
            param="input[0]",
            code="string_above_max_length",
        ),
        InvalidInputError,
        "input_too_long",
    ),
    "content-filter": Row(
        "Azure OpenAI: the prompt triggered the content management policy",
        400,
        {
            "error": {
                "message": "The response was filtered due to the prompt triggering a policy",
                "type": None,
                "param": "prompt",
                "code": "content_filter",
                "status": 400,
            }
        },
        InvalidInputError,
        "input_rejected",
    ),
    "invalid-prompt": Row(
        "OpenAI: a prompt flagged as potentially violating the usage policy",
        400,
        error_body("Invalid prompt: your prompt was flagged", code="invalid_prompt"),
        InvalidInputError,
        "input_rejected",
    ),
    "embedding-input-invalid": Row(
        "OpenAI embeddings: '$.input' is invalid, param input",
        400,
        error_body("'$.input' is invalid.", param="input"),
        InvalidInputError,
        "input_rejected",
        ("embedding",),
    ),
    "chat-messages-invalid": Row(
        "OpenAI chat: an invalid message content, param messages[1].content",
        400,
        error_body("Invalid 'messages[1].content'.", param="messages[1].content"),
        InvalidInputError,
        "input_rejected",
        ("judge",),
    ),
    # --- provider-wide: every note would get it ----------------------------------------------
    "invalid-api-key": Row(
        "OpenAI: 401 incorrect API key provided",
        401,
        error_body("Incorrect API key provided: sk-test-****", code="invalid_api_key"),
        ProviderUnavailableError,
        "authentication",
    ),
    "unauthorized-bare": Row(
        "a gateway's bare 401",
        401,
        {"detail": "Unauthorized"},
        ProviderUnavailableError,
        "authentication",
    ),
    "forbidden-region": Row(
        "OpenAI: 403 country, region or territory not supported",
        403,
        error_body(
            "Country, region, or territory not supported",
            type="request_forbidden",
            code="unsupported_country_region_territory",
        ),
        ProviderUnavailableError,
        "permission",
    ),
    "insufficient-quota": Row(
        "OpenAI: 429 insufficient_quota (plan and billing), not a rate limit",
        429,
        error_body(
            "You exceeded your current quota, please check your plan and billing details.",
            type="insufficient_quota",
            code="insufficient_quota",
        ),
        ProviderUnavailableError,
        "quota",
    ),
    "billing-hard-limit": Row(
        "OpenAI: 400 billing hard limit reached",
        400,
        error_body("Billing hard limit has been reached", code="billing_hard_limit_reached"),
        ProviderUnavailableError,
        "quota",
    ),
    "model-not-found": Row(
        "OpenAI: 404 the model does not exist or you do not have access to it",
        404,
        error_body("The model `gpt-5-mini` does not exist", code="model_not_found"),
        ProviderUnavailableError,
        "unknown_model",
    ),
    "model-not-found-400": Row(
        "a gateway answering model_not_found with 400",
        400,
        error_body("model not found", code="model_not_found"),
        ProviderUnavailableError,
        "unknown_model",
    ),
    "wrong-path": Row(
        "404 on the endpoint (a base URL without /v1)",
        404,
        "Not Found",
        ProviderUnavailableError,
        "not_found",
    ),
    "unsupported-temperature": Row(
        "OpenAI: newer models refuse temperature 0 (unsupported_value, param temperature)",
        400,
        error_body(
            "Unsupported value: 'temperature' does not support 0 with this model.",
            param="temperature",
            code="unsupported_value",
        ),
        ProviderUnavailableError,
        "unsupported_parameter",
    ),
    "unsupported-response-format": Row(
        "a server without structured output: response_format json_schema refused",
        400,
        error_body(
            "Invalid parameter: 'response_format' of type 'json_schema' is not supported",
            param="response_format",
        ),
        ProviderUnavailableError,
        "unsupported_parameter",
    ),
    "unsupported-encoding-format": Row(
        "a server without base64 embeddings: param encoding_format",
        400,
        error_body("encoding_format base64 is not supported", param="encoding_format"),
        ProviderUnavailableError,
        "unsupported_parameter",
        ("embedding",),
    ),
    "bare-400": Row(
        "vLLM / LiteLLM style: no code string, no param",
        400,
        {"error": {"message": "Bad Request", "type": "BadRequestError", "code": 400}},
        ProviderUnavailableError,
        "unrecognised",
    ),
    "html-400": Row(
        "a proxy's HTML error page",
        400,
        "<html><body>400 Bad Request</body></html>",
        ProviderUnavailableError,
        "unrecognised",
    ),
    "validation-422": Row(
        "a FastAPI-based server's 422 validation error",
        422,
        {"detail": [{"loc": ["body", "dimensions"], "msg": "extra fields not permitted"}]},
        ProviderUnavailableError,
        "unrecognised",
    ),
    # --- transient -----------------------------------------------------------------------------
    "rate-limit": Row(
        "OpenAI: 429 rate limit reached (requests per minute)",
        429,
        error_body("Rate limit reached for requests", type="requests", code="rate_limit_exceeded"),
        TransientError,
    ),
    "server-error": Row(
        "OpenAI: 500 the server had an error",
        500,
        error_body("The server had an error"),
        TransientError,
    ),
    "overloaded": Row(
        "503 the engine is currently overloaded", 503, error_body("overloaded"), TransientError
    ),
    "timeout-408": Row("408 request timeout", 408, error_body("timeout"), TransientError),
}


def _cases() -> list[Any]:
    return [
        pytest.param(layer, row, id=f"{layer}-{name}")
        for name, row in ROWS.items()
        for layer in row.layers
    ]


@pytest.fixture
async def providers(fake: FakeOpenAI) -> AsyncIterator[dict[str, Any]]:
    embedder = OpenAIEmbedder(
        base_url=fake.base_url,
        api_key=API_KEY,
        model="text-embedding-3-small",
        dimension=DEFAULT_DIMENSION,
        timeout_seconds=5.0,
        max_retries=RETRIES,
    )
    judge = OpenAIJudge(
        base_url=fake.base_url,
        api_key=API_KEY,
        model="gpt-4o-mini",
        profile="openai-chat-gpt-4o-mini-p2",
        timeout_seconds=5.0,
        max_retries=RETRIES,
        metrics=WorkerMetrics(),
    )
    yield {"embedding": embedder, "judge": judge}
    await embedder.aclose()
    await judge.aclose()


def _scripted(row: Row) -> Scripted:
    # Retry-After 0: a transient row's in-call retries cost no time.
    headers = {"Retry-After": "0"}
    if isinstance(row.body, str):
        return Scripted(status=row.status, raw_body=row.body, headers=headers)
    return Scripted(status=row.status, json=row.body, headers=headers)


@pytest.mark.parametrize(("layer", "row"), _cases())
async def test_each_answer_falls_in_its_class(fake, providers, layer, row) -> None:
    endpoint = "embeddings" if layer == "embedding" else "judge"
    fake.set_fault(endpoint, _scripted(row))

    if layer == "embedding":
        call = providers["embedding"].embed(["메모"])
    else:
        call = providers["judge"].judge("메모", CANDIDATES)
    with pytest.raises(row.expected) as caught:
        await call

    error = caught.value
    assert type(error) is row.expected
    calls = fake.embedding_calls if layer == "embedding" else fake.judge_calls
    if row.expected is TransientError:
        assert calls == RETRIES + 1
    else:
        assert calls == 1, "an input or provider-wide answer is never retried inside the call"
    if row.expected is InvalidInputError:
        assert error.reason == row.reason
    if row.expected is ProviderUnavailableError:
        assert (error.layer, error.reason, error.status) == (layer, row.reason, row.status)
    # Identifiers only, never the provider's message, the key or the endpoint (§6).
    rendered = "".join(traceback.format_exception(error))
    message = (
        row.body["error"]["message"] if isinstance(row.body, dict) and "error" in row.body else None
    )
    if message:
        assert message not in rendered
    assert API_KEY not in rendered
    assert fake.base_url not in rendered


async def test_the_fields_are_read_as_identifiers_only(fake, providers) -> None:
    """``error.code`` / ``type`` / ``param`` reach the error (and so the ERROR line) only as
    identifiers; prose in a field is dropped, never quoted."""
    fake.set_fault(
        "judge",
        Scripted(
            status=400,
            json=error_body(
                "x", type="invalid request error!", code="unsupported_value", param="temperature"
            ),
        ),
    )
    with pytest.raises(ProviderUnavailableError) as caught:
        await providers["judge"].judge("메모", CANDIDATES)

    error = caught.value
    assert (error.code, error.error_type, error.param) == ("unsupported_value", None, "temperature")
