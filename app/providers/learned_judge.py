"""Offline keyword judge learned from our labelled notes (CONTRACT §4).

For each candidate preset with trained weights, the probability that it fits the note is
``sigmoid(w_code . note + b_code)`` over the note's 512-d ``use-multilingual-v3`` vector; the
preset is selected when that reaches the preset's threshold. A candidate without weights
(presets are runtime data: one added after training, or an unknown ``code``) falls back to the
similarity rule: selected when its cosine similarity reaches ``fallback_threshold``.

The weights ship as ``judge_model/use_logreg_r1.npz`` (plain arrays, loaded with
``allow_pickle=False``) beside a JSON file recording what they were trained on (the
development part of ``bench/keyword_eval``; never the test part) and the cross-validation
figures that chose the settings; ``bench/train_judge.py`` rebuilds them deterministically.
Only candidates it is given can be selected, and it reports no unmatched concepts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.errors import ConfigurationError
from app.providers.base import JudgeCandidate, JudgeSelection, JudgeVerdict
from app.providers.sentence_encoder import DIMENSION, SentenceEncoder
from app.providers.similarity_judge import MAX_SELECTED, SimilarityJudge

ARTIFACT_DIR = Path(__file__).with_name("judge_model")
ARTIFACT_NAME = "use_logreg_r1"


@dataclass(frozen=True, slots=True)
class JudgeModel:
    """Per-preset weights: float32 ``(n, 512)``, biases and thresholds ``(n,)``, by code."""

    codes: tuple[str, ...]
    weights: np.ndarray
    biases: np.ndarray
    thresholds: np.ndarray
    revision: int

    def index(self, code: str) -> int | None:
        """Row of ``code``, or ``None`` when the preset was not trained."""
        try:
            return self.codes.index(code)
        except ValueError:
            return None

    def probability(self, row: int, note: np.ndarray) -> float:
        """Probability (0..1) that preset ``row`` fits ``note`` (float32 ``(512,)``)."""
        logit = float(self.weights[row] @ note + self.biases[row])
        return float(1.0 / (1.0 + np.exp(-np.clip(logit, -50.0, 50.0))))


def load_model(directory: Path = ARTIFACT_DIR, name: str = ARTIFACT_NAME) -> JudgeModel:
    """Read the shipped artifact; ``ConfigurationError`` when it is missing or malformed."""
    try:
        meta = json.loads((directory / f"{name}.json").read_text(encoding="utf-8"))
        with np.load(directory / f"{name}.npz", allow_pickle=False) as arrays:
            codes = tuple(str(code) for code in arrays["codes"])
            weights = np.asarray(arrays["weights"], np.float32)
            biases = np.asarray(arrays["biases"], np.float32)
            thresholds = np.asarray(arrays["thresholds"], np.float32)
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigurationError(f"learned judge artifact {name} unreadable: {exc}") from exc
    n = len(codes)
    if weights.shape != (n, DIMENSION) or biases.shape != (n,) or thresholds.shape != (n,):
        raise ConfigurationError(f"learned judge artifact {name} has inconsistent shapes")
    return JudgeModel(codes, weights, biases, thresholds, int(meta["revision"]))


class LearnedJudge:
    """``KeywordJudge`` over a :class:`JudgeModel` and the shared sentence encoder.

    Confidence: the probability for trained presets, the similarity judge's mapping for the
    fallback; rounded to 3 decimals (``NUMERIC(4,3)``). At most ``MAX_SELECTED`` are kept,
    highest confidence first (ties: lower id). ``profile`` is ``Settings.judge_profile``.
    """

    def __init__(
        self,
        encoder: SentenceEncoder,
        model: JudgeModel,
        *,
        fallback_threshold: float,
        profile: str,
        revision: int,
    ) -> None:
        if model.revision != revision:
            raise ConfigurationError(
                f"learned judge artifact is revision {model.revision}, settings expect {revision}"
            )
        self._encoder = encoder
        self._model = model
        self._fallback = SimilarityJudge(fallback_threshold, profile=profile)
        self.profile = profile

    async def judge(self, text: str, candidates: Sequence[JudgeCandidate]) -> JudgeVerdict:
        """Select among ``candidates`` for ``text``; encoder errors propagate (§6)."""
        if not candidates:
            return JudgeVerdict(selected=(), unmatched_concepts=())
        (note,) = await self._encoder.encode([text])  # usually a cache hit: just embedded
        chosen: list[tuple[float, int]] = []
        untrained = []
        for candidate in candidates:
            row = self._model.index(candidate.code)
            if row is None:
                untrained.append(candidate)
                continue
            probability = self._model.probability(row, note)
            if probability >= float(self._model.thresholds[row]):
                chosen.append((round(probability, 3), candidate.id))
        fallback = await self._fallback.judge(text, untrained)
        chosen.extend((item.confidence, item.keyword_id) for item in fallback.selected)
        chosen.sort(key=lambda pair: (-pair[0], pair[1]))
        return JudgeVerdict(
            selected=tuple(JudgeSelection(kid, conf) for conf, kid in chosen[:MAX_SELECTED]),
            unmatched_concepts=(),
        )

    async def aclose(self) -> None:
        """Nothing to release."""
