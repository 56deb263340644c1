"""The OpenAI wire format: building request parts and validating response bodies (§4, §5).

Pure functions, no I/O. Bodies are validated by hand rather than trusted to SDK models
(FC-01, FC-05, FC-08): a malformed 2xx body is a ``ProviderProtocolError`` (provider-wide); a
wrong dimension, a zero vector, or a refused, truncated or invalid judgment is a
``PermanentError`` with its ``FailureReason``. A judge answer may open with a reasoning block
(``<think>…</think>``): it is skipped, never stored or logged.
Vectors are float32 ``numpy.ndarray`` of shape ``(dimension,)``.
"""

from __future__ import annotations

import binascii
import itertools
import json
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from app.errors import (
    DimensionMismatchError,
    InvalidOutputError,
    JudgeRefusedError,
    JudgeTruncatedError,
    PermanentError,
    ProviderProtocolError,
)
from app.providers.base import JudgeCandidate, JudgeSelection, JudgeVerdict
from pinlog_platform.contract.states.failure_reasons import FailureReason

_FLOAT32_MAX = float(np.finfo(np.float32).max)
_NUMBER_TYPES = frozenset({float, int})


def judgment_schema(candidate_ids: Sequence[int]) -> dict[str, Any]:
    """The strict JSON schema of the §4 judge output, ``keywordId`` limited to the candidates."""
    selection = {
        "type": "object",
        "properties": {
            "keywordId": {"type": "integer", "enum": list(candidate_ids)},
            "confidence": {"type": "number"},
        },
        "required": ["keywordId", "confidence"],
        "additionalProperties": False,
    }
    return {
        "type": "object",
        "properties": {
            "selected": {"type": "array", "items": selection},
            "unmatchedConcepts": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["selected", "unmatchedConcepts"],
        "additionalProperties": False,
    }


def malformed(layer: str, reason: str) -> ProviderProtocolError:
    message = f"{layer} provider returned a malformed body: {reason}"
    return ProviderProtocolError(message, layer=layer)


def _from_numbers(values: list[Any], dimension: int) -> np.ndarray:
    # JSON booleans and strings would silently become numbers in numpy. One pass over the
    # element types (C speed) instead of a Python-level check per number.
    types = set(map(type, values))
    if not types <= _NUMBER_TYPES:
        raise malformed("embedding", "non-numeric embedding")
    if len(values) != dimension:
        raise DimensionMismatchError(
            f"embedding dimension mismatch: expected {dimension}, got {len(values)}"
        )
    if int in types and not all(abs(v) <= _FLOAT32_MAX for v in values):
        # Checked before numpy sees them: an integer beyond float64 would overflow it.
        raise malformed("embedding", "non-finite embedding")
    as_float64 = np.asarray(values, dtype=np.float64)
    # Also false for NaN and infinities.
    if not bool(np.all(np.abs(as_float64) <= _FLOAT32_MAX)):
        raise malformed("embedding", "non-finite embedding")
    return as_float64


def _from_base64(encoded: str, dimension: int) -> np.ndarray:
    """``encoding_format: base64``: packed little-endian float32 values."""
    try:
        packed = binascii.a2b_base64(encoded, strict_mode=True)
    except (binascii.Error, ValueError):
        raise malformed("embedding", "invalid base64 embedding") from None
    if len(packed) % 4:
        raise malformed("embedding", "base64 embedding is not float32 values")
    if len(packed) // 4 != dimension:
        raise DimensionMismatchError(
            f"embedding dimension mismatch: expected {dimension}, got {len(packed) // 4}"
        )
    as_float64 = np.frombuffer(packed, dtype="<f4").astype(np.float64)
    if not bool(np.all(np.isfinite(as_float64))):
        raise malformed("embedding", "non-finite embedding")
    return as_float64


def parse_embeddings(body: Any, count: int, dimension: int) -> list[np.ndarray]:
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise malformed("embedding", "missing data")
    if len(data) != count:
        raise malformed("embedding", "wrong number of items")
    by_index: dict[int, np.ndarray] = {}
    for item in data:
        if not isinstance(item, dict):
            raise malformed("embedding", "item is not an object")
        index = item.get("index")
        if type(index) is not int or not 0 <= index < count or index in by_index:
            raise malformed("embedding", "bad index")
        by_index[index] = _vector(item.get("embedding"), dimension)
    return [by_index[i] for i in range(count)]


def _vector(values: Any, dimension: int) -> np.ndarray:
    if isinstance(values, str):
        as_float64 = _from_base64(values, dimension)
    elif isinstance(values, list):
        as_float64 = _from_numbers(values, dimension)
    else:
        raise malformed("embedding", "missing embedding")
    # Normalised in float64: a correctly directed vector at a huge or tiny scale would
    # overflow or underflow a float32 norm and lose its cosine (FC-04).
    norm = float(np.linalg.norm(as_float64))
    if norm == 0.0 or not np.any(unit := (as_float64 / norm).astype(np.float32)):
        # No direction for this input (FC-04): the provider could not embed it.
        raise PermanentError(
            "embedding provider returned a zero vector", reason=FailureReason.INPUT_REJECTED
        )
    return unit


def judge_user_message(text: str, candidates: Sequence[JudgeCandidate]) -> str:
    payload = {
        "note": text,
        "candidates": [
            {
                "id": c.id,
                "display_name": c.display_name,
                "category": c.category,
                "description": c.description,
                "examples": list(c.examples),
            }
            for c in candidates
        ],
    }
    return orjson.dumps(payload).decode()


def parse_verdict(body: Any) -> JudgeVerdict:
    """The §4 verdict of a chat completion body.

    Raises ``ProviderProtocolError`` (no choices or message), ``JudgeRefusedError`` (refusal,
    content filter), ``JudgeTruncatedError`` (truncated even if it parses: FC-08) and
    ``InvalidOutputError`` (content that is not JSON, or not an object with the lists
    ``selected`` and ``unmatchedConcepts``; the judge re-asks once on this one). A content
    wrapped in one Markdown code fence is read inside the fence; a leading reasoning block
    (``<think>…</think>``, or reasoning closed by ``</think>`` whose opening tag was in the
    prompt template, as DeepSeek-R1 and QwQ behind vLLM or Ollama send it) is skipped. A
    separate ``reasoning_content`` field is never read. Items are not validated here
    (``service/judgment.py``).
    """
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise malformed("judge", "missing choices")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise malformed("judge", "missing message")
    if message.get("refusal") or choice.get("finish_reason") == "content_filter":
        raise JudgeRefusedError("judge refused")
    if choice.get("finish_reason") == "length":
        raise JudgeTruncatedError("judge output truncated")
    verdict = _verdict(message.get("content"))
    if verdict is None:
        raise InvalidOutputError("judge output invalid")
    return verdict


# One fenced block and nothing else: what OpenAI-compatible servers without strict
# structured output commonly send (```json ... ```).
_FENCED = re.compile(r"\A\s*```(?:json|JSON)?[ \t]*\r?\n(?P<body>.*?)\s*```\s*\Z", re.DOTALL)
# The end of a leading reasoning block of a reasoning model: ``<think>…</think>`` (also
# ``<thinking>``), or reasoning closed by ``</think>`` whose opening tag the chat template put
# in the prompt. The verdict is what follows one of these ends (the first that reads as one,
# so a block quoting a tag, or nested tags, still leaves the verdict).
_REASONING_END = re.compile(r"</think(?:ing)?>")
_MAX_REASONING_ENDS = 8  # bounds the parse attempts of an answer full of tags


def _verdict(content: Any) -> JudgeVerdict | None:
    if not isinstance(content, str):
        return None
    # A verdict (or a fenced one) never starts with reasoning: only other content is searched
    # for a closing tag, so a concept that quotes "</think>" cannot cut a plain verdict.
    if content.lstrip().startswith(("{", "```")):
        return _parsed_verdict(content)
    for end in itertools.islice(_REASONING_END.finditer(content), _MAX_REASONING_ENDS):
        verdict = _parsed_verdict(content[end.end() :])
        if verdict is not None:
            return verdict
    return None


def _parsed_verdict(content: str) -> JudgeVerdict | None:
    fenced = _FENCED.match(content)
    try:
        parsed = json.loads(fenced["body"] if fenced else content)
    except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
        return None
    if not isinstance(parsed, dict):
        return None
    selected, unmatched = parsed.get("selected"), parsed.get("unmatchedConcepts")
    if not isinstance(selected, list) or not isinstance(unmatched, list):
        return None
    items = tuple(
        JudgeSelection(item.get("keywordId"), item.get("confidence"))
        if isinstance(item, dict)
        else item
        for item in selected
    )
    return JudgeVerdict(selected=items, unmatched_concepts=tuple(unmatched))
