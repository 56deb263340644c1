"""Deterministic offline judge: picks candidates by their cosine similarity alone (CONTRACT §4).

For development and the offline demo. It never reports unmatched concepts: without a language
model there is no way to name what the note says that no preset covers.
"""

from __future__ import annotations

from collections.abc import Sequence

from app.providers.base import JudgeCandidate, JudgeSelection, JudgeVerdict

MAX_SELECTED = 5
_MIN_CONFIDENCE = 0.5


class SimilarityJudge:
    """``KeywordJudge`` selecting candidates whose ``similarity >= threshold``.

    Confidence maps similarity linearly from ``[threshold, 1]`` onto ``[0.5, 1.0]``, clipped to
    that range and rounded to 3 decimals (the ``NUMERIC(4,3)`` column of §1). At most
    ``MAX_SELECTED`` are kept, highest similarity first (ties: lower id first). ``profile``
    (``Settings.judge_profile``) is stored as ``model_profile`` with each judgment (§4).
    """

    def __init__(self, threshold: float, *, profile: str) -> None:
        self.threshold = threshold
        self.profile = profile

    async def judge(self, text: str, candidates: Sequence[JudgeCandidate]) -> JudgeVerdict:
        """Select by similarity; ``text`` is not read. Never raises for well-formed input."""
        # NaN similarities fail the comparison and are never selected (FC-04).
        chosen = sorted(
            (c for c in candidates if c.similarity >= self.threshold),
            key=lambda c: (-c.similarity, c.id),
        )[:MAX_SELECTED]
        return JudgeVerdict(
            selected=tuple(JudgeSelection(c.id, self._confidence(c.similarity)) for c in chosen),
            unmatched_concepts=(),
        )

    async def aclose(self) -> None:
        """Nothing to release."""

    def _confidence(self, similarity: float) -> float:
        span = 1.0 - self.threshold
        fraction = 1.0 if span <= 0 else (similarity - self.threshold) / span
        fraction = min(max(fraction, 0.0), 1.0)
        return round(_MIN_CONFIDENCE + (1.0 - _MIN_CONFIDENCE) * fraction, 3)
