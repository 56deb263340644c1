"""Offline keyword judge learned from our labelled notes (CONTRACT §4).

Features of a note (:func:`note_features`): its 512-d ``use-multilingual-v3`` vector, its
character n-gram hashing vector (``hash_embed(text, hash_dimension)``, 1024-d) and its word
evidence (:func:`word_features`, ``2 n`` for ``n`` trained presets): for each preset, 1.0 when
one of the note's content lemmas (``pinlog_platform.korean_lemmas``: "아늑했음" and "아늑한"
both give "아늑") is in the preset's lexicon and is not negated, and, in the second half, 1.0
when a lexicon lemma occurs only negated ("조용하지 않음", "별로 안 아늑함"). Since revision 4
the n-grams are those of the note without its negated words (:func:`without_negated_words`),
so a denied cue is evidence in neither the lemmas nor the n-grams. The sentence
vector carries the meaning, the n-grams and lemmas the words a reader tags by. The lexicons
(the preset's display name, description and examples analysed the same way, plus the usual
words of the labelling rule) ship in the artifact.

Decision, among the candidates given only:

1. For each candidate preset with trained weights, ``p = sigmoid(w_code . f + b_code)``; it is
   selected when ``p`` reaches the preset's own threshold.
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
Serving needs numpy and the Korean analyser (loaded when the judge is built, at startup);
analysis and scoring run in a worker thread, off the event loop. It reports no unmatched
concepts.
"""

from __future__ import annotations

import asyncio
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
from pinlog_platform.korean_lemmas import KoreanLemmatizer, Lemma

ARTIFACT_DIR = Path(__file__).with_name("judge_model")
ARTIFACT_NAME = "use_logreg_r4"


def word_features(lemmas: Sequence[Lemma], lexicons: Sequence[frozenset[str]]) -> np.ndarray:
    """Float32 ``(2 n,)`` for ``n`` lexicons: ``[said_0 .. said_n-1, denied_0 .. denied_n-1]``;
    ``said_j`` is 1.0 when a non-negated lemma is in lexicon ``j``, ``denied_j`` is 1.0 when
    lexicon ``j`` is met only by negated lemmas."""
    said = {lemma.form for lemma in lemmas if not lemma.negated}
    denied = {lemma.form for lemma in lemmas if lemma.negated}
    n = len(lexicons)
    out = np.zeros(2 * n, np.float32)
    for j, lexicon in enumerate(lexicons):
        if said & lexicon:
            out[j] = 1.0
        elif denied & lexicon:
            out[n + j] = 1.0
    return out


def without_negated_words(text: str, lemmas: Sequence[Lemma]) -> str:
    """``text`` with every whitespace-separated word holding a negated lemma replaced by a space
    ("조용하지 않음" -> " 않음", "커피는 별로" -> " 별로"): the character n-grams of a denied
    cue are not evidence for its preset. ``lemmas`` are ``text``'s, with their offsets."""
    negated = [lemma.start for lemma in lemmas if lemma.negated]
    if not negated:
        return text
    spans, start = [], None
    for i, char in enumerate(text):
        if char.isspace():
            if start is not None:
                spans.append((start, i))
                start = None
        elif start is None:
            start = i
    if start is not None:
        spans.append((start, len(text)))
    dropped = [(a, b) for a, b in spans if any(a <= offset < b for offset in negated)]
    out, last = [], 0
    for a, b in dropped:
        out.append(text[last:a])
        out.append(" ")
        last = b
    out.append(text[last:])
    return "".join(out)


def note_features(
    note_vector: np.ndarray,
    text: str,
    hash_dimension: int,
    lemmas: Sequence[Lemma],
    lexicons: Sequence[frozenset[str]],
    *,
    drop_negated_ngrams: bool = True,
) -> np.ndarray:
    """The judge's input: float32 ``(512 + hash_dimension + 2 len(lexicons),)``: the sentence
    vector, the hashing vector (of :func:`without_negated_words` when ``drop_negated_ngrams``,
    as since revision 4), the word evidence; the trainer uses the same."""
    hashed_text = without_negated_words(text, lemmas) if drop_negated_ngrams else text
    try:
        hashed = hash_embed(hashed_text, hash_dimension)
    except PermanentError:  # a text without any n-gram: no literal cue at all
        hashed = np.zeros(hash_dimension, np.float32)
    return np.concatenate(
        [np.asarray(note_vector, np.float32), hashed, word_features(lemmas, lexicons)]
    )


def _sigmoid(logit: np.ndarray | float) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(logit, -50.0, 50.0)))


@dataclass(frozen=True, slots=True)
class JudgeModel:
    """Per-preset weights float32 ``(n, width)`` with ``width = 512 + hash_dimension + 2 n``,
    biases and thresholds ``(n,)`` by code; each preset's lexicon (lemma forms); the gate's
    weights ``(width,)``; the decision settings."""

    codes: tuple[str, ...]
    lexicons: tuple[frozenset[str], ...]
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
    drop_negated_ngrams: bool = True

    @property
    def width(self) -> int:
        """Length of a feature vector."""
        return DIMENSION + self.hash_dimension + 2 * len(self.codes)

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
        lexicons = tuple(frozenset(meta["lexicons"][code]) for code in codes)
        decision = meta["decision"]
        hash_dimension = int(meta["features"]["hash_dimension"])
        drop_negated_ngrams = bool(meta["features"].get("drop_negated_ngrams", False))
        gate_threshold = float(decision["gate_threshold"])
        top1_floor = float(decision["top1_floor"])
        max_selected = int(decision["max_selected"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigurationError(f"learned judge artifact {name} unreadable: {exc}") from exc
    n, width = len(codes), DIMENSION + hash_dimension + 2 * len(codes)
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
        lexicons,
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
        drop_negated_ngrams,
    )


class LearnedJudge:
    """``KeywordJudge`` over a :class:`JudgeModel`, the shared sentence encoder and the Korean
    analyser, which the constructor loads (blocking, seconds: build the judge at startup).

    Confidence: the probability for trained presets, the similarity judge's mapping for the
    fallback; rounded to 3 decimals (``NUMERIC(4,3)``). At most ``model.max_selected`` are
    kept, highest confidence first (ties: lower id). ``profile`` is ``Settings.judge_profile``.
    """

    def __init__(
        self,
        encoder: SentenceEncoder,
        model: JudgeModel,
        analyser: KoreanLemmatizer,
        *,
        fallback_threshold: float,
        profile: str,
        revision: int,
    ) -> None:
        if model.revision != revision:
            raise ConfigurationError(
                f"learned judge artifact is revision {model.revision}, settings expect {revision}"
            )
        analyser.load()
        self._encoder = encoder
        self._model = model
        self._analyser = analyser
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
        rows = [model.index(candidate.code) for candidate in candidates]
        untrained = [c for c, row in zip(candidates, rows, strict=True) if row is None]
        scored: list[tuple[float, int, bool]] = []  # (probability, id, reached its threshold)
        gate = 0.0
        if len(untrained) < len(candidates):
            # Analysis and scoring cost a few milliseconds of CPU: off the event loop.
            probabilities, gate = await asyncio.to_thread(self._score, note, text)
            for candidate, row in zip(candidates, rows, strict=True):
                if row is not None:
                    p = float(probabilities[row])
                    scored.append((p, candidate.id, p >= float(model.thresholds[row])))
        chosen: list[tuple[float, int]] = []
        if scored and gate >= model.gate_threshold:
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

    def _score(self, note: np.ndarray, text: str) -> tuple[np.ndarray, float]:
        """Every trained preset's probability ``(n,)`` and the gate's, for one note."""
        model = self._model
        lemmas = self._analyser.analyse(text)
        features = note_features(
            note,
            text,
            model.hash_dimension,
            lemmas,
            model.lexicons,
            drop_negated_ngrams=model.drop_negated_ngrams,
        )
        probabilities = _sigmoid(model.weights @ features + model.biases)
        return probabilities, model.gate(features)

    async def aclose(self) -> None:
        """Nothing to release."""
