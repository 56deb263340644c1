"""A real local HTTP server speaking the OpenAI wire format, for tests (STYLE practice 12).

Starlette + uvicorn in a background thread on ``127.0.0.1`` with an OS-assigned port; the code
under test reaches it over TCP through the real ``openai`` SDK, so nothing is patched.

- ``POST /v1/embeddings``: by default ``hash_embed(text, dimension)`` per input, where
  ``dimension`` is the one set for the request's ``model`` (``set_model_dimension``: two
  embedding models side by side, as during a profile switch), else the server's.
- ``POST /v1/chat/completions``: by default selects the first id of the ``keywordId`` enum in
  the request's ``response_format`` schema with confidence 0.9 (``set_judge_selection`` changes
  that), ``unmatchedConcepts: []``, ``finish_reason: "stop"``.

``script_embeddings`` / ``script_judge`` queue one-shot ``Scripted`` answers consumed in order;
``Scripted.entered`` is set when its request arrives and ``Scripted.block`` holds the answer
until the test sets it, so race tests drive interleavings with events, never with sleeps.
``set_fault`` gives every later request of an endpoint one answer until cleared (a provider
whose key, quota or model is wrong: ``error_body`` speaks OpenAI's error shape with ``type``,
``code`` and ``param``); ``fail_inputs_containing`` answers only embedding requests whose input
holds a marker (one bad note among good ones); ``set_judge_reasoning`` makes the default
judgment speak like a reasoning model (a ``<think>`` block before the verdict, a
``reasoning_content`` field, ``usage.completion_tokens_details.reasoning_tokens``).
Default answers carry a ``usage`` of about four characters per token (``set_usage(False)``
omits it, as some OpenAI-compatible servers do); ``usage_sent`` lists the usage of each default
answer sent, per endpoint, for the ledger's tests.

Chat answers count the prompt as OpenAI renders it for its prompt cache: the structured output
schema first (OpenAI: "the structured output schema serves as a prefix to the system
message"), then each message; and report ``usage.prompt_tokens_details.cached_tokens`` as
OpenAI's automatic prompt caching does: 0 unless the rendered prompt shares a prefix of at least
1,024 tokens with an earlier chat request of the same model, then that prefix rounded down to
1,024 + a multiple of 128 tokens. The cache keeps every request since ``reset`` (no eviction;
``set_prompt_cache(False)`` turns it off).
The Batch API (files, batches, their status transitions, output and error files, expiry and
cancel) is ``tests/fake_openai_batches.py``, reached as ``fake.batches``.
Every control is guarded by one lock: the server thread and the pytest thread both touch them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from app.errors import PermanentError
from app.providers.hashing import hash_embed
from tests.fake_openai_batches import FakeBatches

BLOCK_TIMEOUT_SECONDS = 30.0
DEFAULT_DIMENSION = 1536

SelectionItem = Mapping[str, Any] | tuple[int, float]
JudgeSelectionFn = Callable[[list[int]], Iterable[SelectionItem]]


@dataclass(eq=False)
class Scripted:
    """One queued answer. ``json=None`` with status 200 means "the default answer, but with
    this delay/block/headers"; ``raw_body`` (not JSON) wins over ``json``."""

    status: int = 200
    json: Any = None
    headers: dict[str, str] | None = None
    delay_seconds: float = 0.0
    block: threading.Event | None = None
    raw_body: str | None = None
    entered: threading.Event = field(default_factory=threading.Event)


def embedding_body(
    vectors: Iterable[Iterable[float]], model: str = "fake-embedding", encoding: str = "float"
) -> dict:
    """An OpenAI ``/embeddings`` response body with items in input order (``index`` = i);
    ``encoding`` ``base64`` packs each vector as little-endian float32, as OpenAI does."""
    data = [
        {"object": "embedding", "index": i, "embedding": _encoded(vector, encoding)}
        for i, vector in enumerate(vectors)
    ]
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": len(data), "total_tokens": len(data)},
    }


def error_body(
    message: str = "scripted failure",
    *,
    type: str | None = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
) -> dict:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def judge_body(
    selected: Iterable[SelectionItem],
    unmatched: Iterable[str] = (),
    finish_reason: str = "stop",
    refusal: str | None = None,
    raw_content: str | None = None,
    model: str = "fake-chat",
    reasoning: str | None = None,
    lone_reasoning: bool = False,
    reasoning_content: str | None = None,
) -> dict:
    """An OpenAI ``/chat/completions`` body; ``selected`` items are dicts or ``(id, conf)``.

    ``raw_content`` replaces the JSON content verbatim; a ``refusal`` makes ``content`` null.
    ``reasoning`` puts ``<think>reasoning</think>`` before the content, as DeepSeek-R1 and QwQ
    behind vLLM or Ollama do (``lone_reasoning``: without the opening tag, which their chat
    templates put in the prompt); ``reasoning_content`` is the separate field some servers use.
    """
    if raw_content is not None:
        content: str | None = raw_content
    elif refusal is not None:
        content = None
    else:
        answer = {
            "selected": [_selection_item(item) for item in selected],
            "unmatchedConcepts": list(unmatched),
        }
        content = json.dumps(answer, ensure_ascii=False)
    if reasoning is not None and content is not None:
        opening = "" if lone_reasoning else "<think>"
        content = f"{opening}{reasoning}</think>\n\n{content}"
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": refusal}
    usage: dict[str, Any] = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    if reasoning_content is not None:
        message["reasoning_content"] = reasoning_content
    if reasoning is not None or reasoning_content is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": 1}
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": usage,
    }


class FakeOpenAI:
    """The server; ``with FakeOpenAI() as fake:`` or ``start()`` / ``stop()``."""

    def __init__(self, *, dimension: int = DEFAULT_DIMENSION) -> None:
        self._lock = threading.Lock()
        self._default_dimension = dimension
        self.batches = FakeBatches(self._batch_answer)
        self._app = Starlette(
            routes=[
                Route("/v1/embeddings", self._embeddings, methods=["POST"]),
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                *self.batches.routes(),
            ]
        )
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.base_url = ""
        self.reset()

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> FakeOpenAI:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        config = uvicorn.Config(
            self._app,
            lifespan="off",
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="fake-openai", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("fake OpenAI server did not start")
            time.sleep(0.01)
        self.base_url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def reset(self) -> None:
        """Forget calls, requests, scripts, files and batches; restore the default dimensions
        and selection."""
        self.batches.reset()
        with self._lock:
            self._calls = {"embeddings": 0, "judge": 0}
            self._requests: dict[str, list[Any]] = {"embeddings": [], "judge": []}
            self._traceparents: dict[str, list[str | None]] = {"embeddings": [], "judge": []}
            self._arrivals: dict[str, list[float]] = {"embeddings": [], "judge": []}
            self._scripts: dict[str, deque[Scripted]] = {"embeddings": deque(), "judge": deque()}
            self._dimension = self._default_dimension
            self._model_dimensions: dict[str, int] = {}
            self._selection: JudgeSelectionFn | None = None
            self._faults: dict[str, Scripted | None] = {"embeddings": None, "judge": None}
            self._input_faults: list[tuple[str, Scripted]] = []
            self._reasoning: dict[str, Any] | None = None
            self._usage = True
            self._usage_sent: dict[str, list[dict[str, Any]]] = {"embeddings": [], "judge": []}
            self._prompt_cache = PromptCache()
            self._caching = True

    def script_embeddings(self, *responses: Scripted) -> None:
        with self._lock:
            self._scripts["embeddings"].extend(responses)

    def script_judge(self, *responses: Scripted) -> None:
        with self._lock:
            self._scripts["judge"].extend(responses)

    def set_fault(self, endpoint: str, answer: Scripted | None) -> None:
        """Answer every later request of ``endpoint`` (``"embeddings"`` / ``"judge"``) with
        ``answer`` once the scripts are used up, until set back to ``None``; never consumed."""
        with self._lock:
            self._faults[endpoint] = answer

    def fail_inputs_containing(self, marker: str, answer: Scripted) -> None:
        """Answer ``answer`` to every embedding request one of whose inputs contains
        ``marker`` (before scripts and faults)."""
        with self._lock:
            self._input_faults.append((marker, answer))

    def set_judge_reasoning(
        self,
        reasoning: str | None,
        *,
        lone: bool = False,
        reasoning_content: str | None = None,
    ) -> None:
        """Default judgments open with ``<think>reasoning</think>`` (``lone``: no opening
        tag) and carry ``reasoning_content``; ``None`` restores plain answers."""
        with self._lock:
            self._reasoning = (
                None
                if reasoning is None and reasoning_content is None
                else {
                    "reasoning": reasoning,
                    "lone_reasoning": lone,
                    "reasoning_content": reasoning_content,
                }
            )

    def set_usage(self, present: bool) -> None:
        """Default answers with (``True``, the default) or without a ``usage`` object."""
        with self._lock:
            self._usage = present

    def set_prompt_cache(self, enabled: bool) -> None:
        """Report cached prompt tokens (``True``, the default) or never (and forget the
        cache)."""
        with self._lock:
            self._caching = enabled
            self._prompt_cache = PromptCache()

    @property
    def usage_sent(self) -> dict[str, list[dict[str, Any]]]:
        """The ``usage`` of each default answer sent, by endpoint (``embeddings``, ``judge``)."""
        with self._lock:
            return {endpoint: list(sent) for endpoint, sent in self._usage_sent.items()}

    def _with_usage(self, endpoint: str, body: dict, usage: dict[str, Any]) -> dict:
        with self._lock:
            present = self._usage
            if present:
                self._usage_sent[endpoint].append(usage)
        if present:
            return {**body, "usage": usage}
        return {key: value for key, value in body.items() if key != "usage"}

    def set_embedding_dimension(self, dimension: int) -> None:
        with self._lock:
            self._dimension = dimension

    def set_model_dimension(self, model: str, dimension: int | None) -> None:
        """Answer embedding requests naming ``model`` with vectors of ``dimension`` (``None``:
        the server's dimension again); other models keep the server's."""
        with self._lock:
            if dimension is None:
                self._model_dimensions.pop(model, None)
            else:
                self._model_dimensions[model] = dimension

    def set_judge_selection(self, fn: JudgeSelectionFn | None) -> None:
        """``fn(candidate_ids) -> selected items``; ``None`` restores the default."""
        with self._lock:
            self._selection = fn

    @property
    def embedding_calls(self) -> int:
        with self._lock:
            return self._calls["embeddings"]

    @property
    def judge_calls(self) -> int:
        with self._lock:
            return self._calls["judge"]

    @property
    def embedding_requests(self) -> list[Any]:
        with self._lock:
            return list(self._requests["embeddings"])

    def traceparents(self, endpoint: str) -> list[str | None]:
        """The ``traceparent`` header of each request to ``endpoint`` (``embeddings`` or
        ``judge``) since ``reset``, ``None`` where there was none."""
        with self._lock:
            return list(self._traceparents[endpoint])

    @property
    def judge_requests(self) -> list[Any]:
        with self._lock:
            return list(self._requests["judge"])

    @property
    def embedding_arrivals(self) -> list[float]:
        """``time.monotonic()`` of each embedding request's arrival, in order."""
        with self._lock:
            return list(self._arrivals["embeddings"])

    @property
    def judge_arrivals(self) -> list[float]:
        """``time.monotonic()`` of each judge request's arrival, in order."""
        with self._lock:
            return list(self._arrivals["judge"])

    async def _embeddings(self, request: Request) -> Response:
        payload, scripted = await self._arrive("embeddings", request)
        model = payload.get("model") if isinstance(payload, dict) else None
        with self._lock:
            dimension = self._dimension
            if isinstance(model, str):
                dimension = self._model_dimensions.get(model, dimension)
        return await self._answer(
            scripted,
            lambda: self._with_usage(
                "embeddings",
                _default_embeddings(payload, dimension),
                _embedding_usage(payload),
            ),
        )

    async def _chat(self, request: Request) -> Response:
        payload, scripted = await self._arrive("judge", request)
        with self._lock:
            selection, reasoning = self._selection, self._reasoning

        def answer() -> dict:
            body = _default_judgment(payload, selection, reasoning)
            rendered = rendered_prompt(payload)
            with self._lock:
                cached = self._prompt_cache.lookup(payload.get("model"), rendered)
                if not self._caching:
                    cached = 0
            return self._with_usage("judge", body, _chat_usage(rendered, body, cached))

        return await self._answer(scripted, answer)

    def _batch_answer(self, endpoint: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """A batch line's answer: the default answer of ``endpoint``, ``usage`` (and the prompt
        cache) included; scripts and faults are the synchronous endpoints' only."""
        with self._lock:
            selection, reasoning = self._selection, self._reasoning
            model = body.get("model")
            dimension = self._dimension
            if isinstance(model, str):
                dimension = self._model_dimensions.get(model, dimension)
        try:
            if endpoint == "/v1/embeddings":
                answer = _default_embeddings(body, dimension)
                return 200, {**answer, "usage": _embedding_usage(body)}
            answer = _default_judgment(body, selection, reasoning)
            rendered = rendered_prompt(body)
            with self._lock:
                cached = self._prompt_cache.lookup(model, rendered) if self._caching else 0
            return 200, {**answer, "usage": _chat_usage(rendered, answer, cached)}
        except PermanentError:
            return 400, error_body("input has no content", param="input")
        except (KeyError, TypeError, IndexError):
            return 400, error_body("malformed request body")

    async def _arrive(self, endpoint: str, request: Request) -> tuple[Any, Scripted | None]:
        payload = json.loads(await request.body())
        with self._lock:
            self._calls[endpoint] += 1
            self._requests[endpoint].append(payload)
            self._traceparents[endpoint].append(request.headers.get("traceparent"))
            self._arrivals[endpoint].append(time.monotonic())
            queue = self._scripts[endpoint]
            scripted = (
                _input_fault(payload, self._input_faults) if endpoint == "embeddings" else None
            )
            if scripted is None:
                scripted = queue.popleft() if queue else self._faults[endpoint]
        if scripted is not None:
            scripted.entered.set()
        return payload, scripted

    async def _answer(self, scripted: Scripted | None, default: Callable[[], Any]) -> Response:
        status, headers = 200, None
        if scripted is not None:
            status, headers = scripted.status, scripted.headers
            await asyncio.sleep(scripted.delay_seconds)
            if scripted.block is not None:
                await _wait(scripted.block)
        if scripted is not None and scripted.raw_body is not None:
            body = scripted.raw_body
        elif scripted is not None and scripted.json is not None:
            body = json.dumps(scripted.json, ensure_ascii=False)
        elif status == 200:
            try:
                body = json.dumps(default(), ensure_ascii=False)
            except PermanentError:
                status, body = 400, json.dumps(error_body("input has no content", param="input"))
        else:
            body = json.dumps(_error("scripted failure"))
        return Response(body, status_code=status, headers=headers, media_type="application/json")


async def _wait(event: threading.Event) -> None:
    # A threading.Event cannot be awaited; polling keeps the server's event loop and thread
    # pool free while any number of calls are held.
    deadline = time.monotonic() + BLOCK_TIMEOUT_SECONDS
    while not event.is_set() and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.005)


def _encoded(vector: Iterable[float], encoding: str) -> list[float] | str:
    if encoding == "base64":
        packed = np.asarray(list(vector), dtype="<f4").tobytes()
        return base64.b64encode(packed).decode("ascii")
    return [float(x) for x in vector]


def _default_embeddings(payload: Mapping[str, Any], dimension: int) -> dict:
    inputs = payload["input"]
    texts: Sequence[str] = [inputs] if isinstance(inputs, str) else inputs
    vectors = (hash_embed(text, dimension) for text in texts)
    # The API's default when the field is absent is float.
    return embedding_body(vectors, payload["model"], payload.get("encoding_format") or "float")


def _default_judgment(
    payload: Mapping[str, Any],
    selection: JudgeSelectionFn | None,
    reasoning: Mapping[str, Any] | None = None,
) -> dict:
    ids = candidate_ids(payload)
    if selection is not None:
        selected = list(selection(ids))
    else:
        selected = [{"keywordId": ids[0], "confidence": 0.9}] if ids else []
    return judge_body(selected, model=payload.get("model", "fake-chat"), **(reasoning or {}))


CHARS_PER_TOKEN = 4
CACHE_MIN_TOKENS = 1024  # OpenAI: caching applies to prompts of 1,024 tokens or more
CACHE_STEP_TOKENS = 128  # OpenAI: cache hits grow in increments of 128 tokens


def _tokens(text: str) -> int:
    return max(1, len(text) // CHARS_PER_TOKEN)


def rendered_prompt(payload: Mapping[str, Any]) -> str:
    """A chat request's prompt in OpenAI's cache order: the ``response_format`` schema, then
    each message's role and content."""
    parts = []
    with contextlib.suppress(KeyError, TypeError):
        parts.append(json.dumps(payload["response_format"]["json_schema"]["schema"]))
    for message in payload.get("messages", []):
        parts.append(f"{message.get('role', '')}: {message.get('content', '')}")
    return "\n".join(parts)


class PromptCache:
    """The prefixes of earlier prompts at every cacheable length (1,024 tokens, then steps of
    128), per model, as digests; ``lookup`` returns the cached tokens of a prompt and adds it."""

    def __init__(self) -> None:
        self._prefixes: set[tuple[Any, int, bytes]] = set()

    def lookup(self, model: Any, rendered: str) -> int:
        tokens = len(rendered) // CHARS_PER_TOKEN
        cached = 0
        matching = True  # a longer prefix is cached only if every shorter one is
        digest = hashlib.sha256()
        done = 0  # characters hashed so far
        length = CACHE_MIN_TOKENS
        while length <= tokens:
            end = length * CHARS_PER_TOKEN
            digest.update(rendered[done:end].encode("utf-8", "surrogatepass"))
            done = end
            key = (model if isinstance(model, str) else None, length, digest.digest())
            if matching and key in self._prefixes:
                cached = length
            else:
                matching = False
                self._prefixes.add(key)
            length += CACHE_STEP_TOKENS
        return cached


def _embedding_usage(payload: Mapping[str, Any]) -> dict[str, int]:
    inputs = payload["input"]
    texts: Sequence[str] = [inputs] if isinstance(inputs, str) else inputs
    tokens = sum(_tokens(text) for text in texts)
    return {"prompt_tokens": tokens, "total_tokens": tokens}


def _chat_usage(rendered: str, body: Mapping[str, Any], cached: int) -> dict[str, Any]:
    prompt = _tokens(rendered)
    completion = _tokens(body["choices"][0]["message"]["content"] or "")
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def _input_fault(payload: Any, faults: list[tuple[str, Scripted]]) -> Scripted | None:
    inputs = payload.get("input") if isinstance(payload, dict) else None
    texts = [inputs] if isinstance(inputs, str) else list(inputs or [])
    for marker, answer in faults:
        if any(isinstance(text, str) and marker in text for text in texts):
            return answer
    return None


def candidate_ids(payload: Mapping[str, Any]) -> list[int]:
    """The ``keywordId`` enum of a chat request's ``response_format`` schema (``[]`` if none)."""
    try:
        schema = payload["response_format"]["json_schema"]["schema"]
        return list(schema["properties"]["selected"]["items"]["properties"]["keywordId"]["enum"])
    except (KeyError, TypeError):
        return []


def _selection_item(item: SelectionItem) -> dict[str, Any]:
    if isinstance(item, tuple):
        return {"keywordId": item[0], "confidence": item[1]}
    return dict(item)


def _error(message: str) -> dict[str, Any]:
    return error_body(message)
