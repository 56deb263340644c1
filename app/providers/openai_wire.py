"""The OpenAI wire format: building request parts and validating response bodies (§4, §5).

Pure functions, no I/O. Bodies are validated by hand rather than trusted to SDK models
(FC-01, FC-05, FC-08): a malformed 2xx body is a ``ProviderProtocolError``; a wrong dimension,
a zero vector, or a refused, truncated or invalid judgment is a ``PermanentError``.
Vectors are float32 ``numpy.ndarray`` of shape ``(dimension,)``.
"""

from __future__ import annotations

import binascii
import json
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from app.errors import (
    InvalidOutputError,
    PermanentError,
    ProviderProtocolError,
    ProviderRefusedError,
)
from app.providers.base import JudgeCandidate, JudgeSelection, JudgeVerdict

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
    return ProviderProtocolError(f"{layer} provider returned a malformed body: {reason}")


def _from_numbers(values: list[Any], dimension: int) -> np.ndarray:
    # JSON booleans and strings would silently become numbers in numpy. One pass over the
    # element types (C speed) instead of a Python-level check per number.
    types = set(map(type, values))
    if not types <= _NUMBER_TYPES:
        raise malformed("embedding", "non-numeric embedding")
    if len(values) != dimension:
        raise ProviderRefusedError(
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
        raise ProviderRefusedError(
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
    if norm == 0.0:
        raise PermanentError("embedding provider returned a zero vector")
    unit = (as_float64 / norm).astype(np.float32)
    if not np.any(unit):
        raise PermanentError("embedding provider returned a zero vector")
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

    Raises ``ProviderProtocolError`` (no choices or message), ``PermanentError`` (refused,
    content filter, truncated even if it parses: FC-08) and ``InvalidOutputError`` (content that
    is not JSON, or not an object with the lists ``selected`` and ``unmatchedConcepts``; the
    judge re-asks once on this one). A content wrapped in one Markdown code fence is read
    inside the fence. Items are not validated here (``service/judgment.py``).
    """
    choices = body.get("choices") if isinstance(body, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise malformed("judge", "missing choices")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise malformed("judge", "missing message")
    if message.get("refusal") or choice.get("finish_reason") == "content_filter":
        raise PermanentError("judge refused")
    if choice.get("finish_reason") == "length":
        raise PermanentError("judge output truncated")
    verdict = _verdict(message.get("content"))
    if verdict is None:
        raise InvalidOutputError("judge output invalid")
    return verdict


# One fenced block and nothing else: what OpenAI-compatible servers without strict
# structured output commonly send (```json ... ```).
_FENCED = re.compile(r"\A\s*```(?:json|JSON)?[ \t]*\r?\n(?P<body>.*?)\s*```\s*\Z", re.DOTALL)


def _verdict(content: Any) -> JudgeVerdict | None:
    if not isinstance(content, str):
        return None
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
