"""Provider interfaces and the value types that cross them (CONTRACT §3, §4, §5).

Vectors are ``numpy.ndarray`` of dtype float32 and shape ``(dimension,)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True, slots=True)
class JudgeCandidate:
    """One preset offered to the judge (§4 judge input); ``similarity`` is cosine, -1..1.

    ``code`` lets a trained judge find its weights; it is not part of the LLM prompt.
    """

    id: int
    display_name: str
    category: str
    description: str
    examples: tuple[str, ...]
    similarity: float
    code: str = ""


@dataclass(frozen=True, slots=True)
class JudgeSelection:
    """One object item of the judge output with its raw JSON values (``None`` when absent),
    unvalidated: ``service/judgment.py`` keeps or drops each item by the §4 rules. Expected:
    ``keyword_id`` an integer of a candidate, ``confidence`` a number in 0..1."""

    keyword_id: object
    confidence: object


@dataclass(frozen=True, slots=True)
class JudgeVerdict:
    """The judge output of §4: ``{"selected": [...], "unmatchedConcepts": [...]}``.

    Only the overall structure is guaranteed (two lists). ``selected`` holds a
    ``JudgeSelection`` per object item and any other JSON value as it came (an item that is
    not an object); ``unmatched_concepts`` holds the raw list items. The mapping drops
    malformed items one by one, never coercing them.
    """

    selected: tuple[object, ...]
    unmatched_concepts: tuple[object, ...]
    # The judge that answered (its ``model_profile``), when a chain of judges chose among
    # several; ``None``: the configured judge's profile.
    profile: str | None = None


class EmbeddingProvider(Protocol):
    """Turns texts into vectors of the configured dimension."""

    dimension: int

    async def embed(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Return one L2-normalised float32 vector of shape ``(dimension,)`` per input, in
        input order.

        Raises ``TransientError`` (timeout, 429, 5xx, connection), ``ProviderProtocolError``
        (2xx with a malformed body), ``PermanentError`` (4xx, wrong dimension, zero vector).
        """
        ...

    async def aclose(self) -> None:
        """Release HTTP connections."""
        ...


class KeywordJudge(Protocol):
    """Chooses among candidates; ``profile`` names the judge for ``model_profile`` (§4)."""

    profile: str

    async def judge(self, text: str, candidates: Sequence[JudgeCandidate]) -> JudgeVerdict:
        """Judge ``text`` against ``candidates`` (non-empty). Same errors as ``embed``."""
        ...

    async def aclose(self) -> None:
        """Release HTTP connections."""
        ...
