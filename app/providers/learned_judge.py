"""Offline keyword judge learned from our labelled notes (CONTRACT §4).

Features of a note: its 512-d ``use-multilingual-v3`` vector followed by its character n-gram
hashing vector (``hash_embed(text, hash_dimension)``, 1024-d): the sentence vector carries the
meaning, the n-grams the literal cues (혼술, 해장, 콘센트) that a 512-d summary blurs.

Decision, among the candidates given only:

1. For each candidate preset with trained weights, ``p = sigmoid(w_code . f + b_code)``; it is
   selected when ``p`` reaches the preset's threshold.
2. A "has any keyword" gate, ``sigmoid(w_gate . f + b_gate)``: below ``gate_threshold`` no
   trained preset is selected (facility-only notes: parking, hours, payment, Wi-Fi).
3. When the gate passes and nothing reached its threshold, the best trained candidate is taken
   if its ``p`` reaches ``top1_floor``.
4. A candidate without weights (presets are runtime data: one added after training, or an
   unknown ``code``) falls back to the similarity rule: selected when its cosine similarity
   reaches ``fallback_threshold`` (the gate does not apply to it: it was not trained on it).
5. At most ``max_selected`` are kept, highest confidence first.

The weights ship as ``judge_model/use_logreg_r<revision>.npz`` (plain arrays, loaded with
``allow_pickle=False``) beside a JSON file recording what they were trained on (the
development part of ``bench/keyword_eval``; never the test part) and the cross-validation
figures that chose the settings; ``bench/train_judge.py`` rebuilds them deterministically.
Serving needs numpy only. It reports no unmatched concepts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.errors import ConfigurationError, PermanentError, ProviderUnavailableError
from app.providers.base import JudgeCandidate, JudgeSelection, JudgeVerdict
from app.providers.hashing import hash_embed
from app.providers.sentence_encoder import DIMENSION, SentenceEncoder
from app.providers.similarity_judge import MAX_SELECTED, SimilarityJudge

ARTIFACT_DIR = Path(__file__).with_name("judge_model")
ARTIFACT_NAME = "use_logreg_r2"


def note_features(note_vector: np.ndarray, text: str, hash_dimension: int) -> np.ndarray:
    """The judge's input: float32 ``(512 + hash_dimension,)``; the trainer uses the same."""
    try:
        hashed = hash_embed(text, hash_dimension)
    except PermanentError:  # a text without any n-gram: no literal cue at all
        hashed = np.zeros(hash_dimension, np.float32)
    return np.concatenate([np.asarray(note_vector, np.float32), hashed])


def _sigmoid(logit: np.ndarray | float) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(logit, -50.0, 50.0)))


@dataclass(frozen=True, slots=True)
class JudgeModel:
    """Per-preset weights float32 ``(n, 512 + hash_dimension)``, biases and thresholds ``(n,)``
    by code; the gate's weights ``(512 + hash_dimension,)``; the decision settings."""

    codes: tuple[str, ...]
    weights: np.ndarray
    biases: np.ndarray
    thresholds: np.ndarray
    gate_weights: np.ndarray
    gate_bias: float
    gate_threshold: float
    top1_floor: float
    max_selected: int
    hash_dimension: int
    revision: int

    def index(self, code: str) -> int | None:
        """Row of ``code``, or ``None`` when the preset was not trained."""
        try:
            return self.codes.index(code)
        except ValueError:
            return None

    def probability(self, row: int, features: np.ndarray) -> float:
        """Probability (0..1) that preset ``row`` fits the note with ``features``."""
        return float(_sigmoid(float(self.weights[row] @ features + self.biases[row])))

    def gate(self, features: np.ndarray) -> float:
        """Probability (0..1) that the note deserves any keyword at all."""
        return float(_sigmoid(float(self.gate_weights @ features + self.gate_bias)))


def load_model(directory: Path = ARTIFACT_DIR, name: str = ARTIFACT_NAME) -> JudgeModel:
    """Read the shipped artifact; ``ConfigurationError`` when it is missing or malformed."""
    try:
        meta = json.loads((directory / f"{name}.json").read_text(encoding="utf-8"))
        with np.load(directory / f"{name}.npz", allow_pickle=False) as arrays:
            codes = tuple(str(code) for code in arrays["codes"])
            weights = np.asarray(arrays["weights"], np.float32)
            biases = np.asarray(arrays["biases"], np.float32)
            thresholds = np.asarray(arrays["thresholds"], np.float32)
            gate_weights = np.asarray(arrays["gate_weights"], np.float32)
            gate_bias = float(arrays["gate_bias"])
        decision = meta["decision"]
        hash_dimension = int(meta["features"]["hash_dimension"])
        gate_threshold = float(decision["gate_threshold"])
        top1_floor = float(decision["top1_floor"])
        max_selected = int(decision["max_selected"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigurationError(f"learned judge artifact {name} unreadable: {exc}") from exc
    n, width = len(codes), DIMENSION + hash_dimension
    if (
        weights.shape != (n, width)
        or biases.shape != (n,)
        or thresholds.shape != (n,)
        or gate_weights.shape != (width,)
        or not 1 <= max_selected <= MAX_SELECTED
    ):
        raise ConfigurationError(f"learned judge artifact {name} has inconsistent shapes")
    return JudgeModel(
        codes,
        weights,
        biases,
        thresholds,
        gate_weights,
        gate_bias,
        gate_threshold,
        top1_floor,
        max_selected,
        hash_dimension,
        int(meta["revision"]),
    )


class LearnedJudge:
    """``KeywordJudge`` over a :class:`JudgeModel` and the shared sentence encoder.

    Confidence: the probability for trained presets, the similarity judge's mapping for the
    fallback; rounded to 3 decimals (``NUMERIC(4,3)``). At most ``model.max_selected`` are
    kept, highest confidence first (ties: lower id). ``profile`` is ``Settings.judge_profile``.
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
        """Select among ``candidates`` for ``text``; encoder errors propagate (§6), a failing
        encoder as the judge's provider-wide fault (its gate counts it, no note fails)."""
        if not candidates:
            return JudgeVerdict(selected=(), unmatched_concepts=())
        model = self._model
        try:
            (note,) = await self._encoder.encode([text])  # usually a cache hit: just embedded
        except ProviderUnavailableError as exc:
            raise ProviderUnavailableError(
                "learned judge's encoder failed", layer="judge", reason=exc.reason
            ) from None
        features = note_features(note, text, model.hash_dimension)
        scored: list[tuple[float, int, bool]] = []  # (probability, id, reached its threshold)
        untrained = []
        for candidate in candidates:
            row = model.index(candidate.code)
            if row is None:
                untrained.append(candidate)
                continue
            probability = model.probability(row, features)
            scored.append((probability, candidate.id, probability >= float(model.thresholds[row])))
        chosen: list[tuple[float, int]] = []
        if scored and model.gate(features) >= model.gate_threshold:
            chosen = [(round(p, 3), kid) for p, kid, reached in scored if reached]
            if not chosen:
                p, kid, _ = min(scored, key=lambda item: (-item[0], item[1]))
                if p >= model.top1_floor:
                    chosen = [(round(p, 3), kid)]
        fallback = await self._fallback.judge(text, untrained)
        chosen.extend((item.confidence, item.keyword_id) for item in fallback.selected)
        chosen.sort(key=lambda pair: (-pair[0], pair[1]))
        return JudgeVerdict(
            selected=tuple(JudgeSelection(kid, conf) for conf, kid in chosen[: model.max_selected]),
            unmatched_concepts=(),
        )

    async def aclose(self) -> None:
        """Nothing to release."""
