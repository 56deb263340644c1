"""The offline learned judge (§4): what it was trained on, its word features and negation,
candidates only, fallback rule, the gate, the best-one floor and the cap, and the serving rule
equal to the one tuned."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from app.errors import ConfigurationError
from app.providers.base import JudgeCandidate
from app.providers.hashing import hash_embed
from app.providers.learned_judge import (
    ARTIFACT_DIR,
    ARTIFACT_NAME,
    JudgeModel,
    LearnedJudge,
    load_model,
    note_features,
    without_negated_words,
    word_features,
)
from app.providers.sentence_encoder import shared_encoder
from app.service.preset_loader import read_preset_file
from app.settings import LEARNED_JUDGE_REVISION
from pinlog_platform.korean_lemmas import shared_analyser

EVAL_DIR = Path(__file__).resolve().parents[3] / "bench" / "keyword_eval"
PRESETS = {p.code: p for p in read_preset_file().presets}


def _candidate(code: str, similarity: float = 0.3) -> JudgeCandidate:
    p = PRESETS[code]
    return JudgeCandidate(
        p.id, p.display_name, p.category, p.description, p.examples, similarity, code=p.code
    )


def _judge(fallback: float = 0.26, model: JudgeModel | None = None) -> LearnedJudge:
    return LearnedJudge(
        shared_encoder(),
        model or load_model(),
        shared_analyser(),
        fallback_threshold=fallback,
        profile="local-use-logreg-judge-test",
        revision=LEARNED_JUDGE_REVISION,
    )


def test_artifact_was_trained_on_the_committed_development_part_only():
    meta = json.loads((ARTIFACT_DIR / f"{ARTIFACT_NAME}.json").read_text(encoding="utf-8"))
    parts = meta["trained_on"]["development_parts"]

    assert [p["file"] for p in parts] == ["dev.yaml", "dev_reader.yaml", "dev_reader2.yaml"]
    for part in parts:
        digest = hashlib.sha256((EVAL_DIR / part["file"]).read_bytes()).hexdigest()
        assert part["sha256"] == digest
    assert "test" not in json.dumps(meta["trained_on"])
    assert "demo" not in json.dumps(meta["trained_on"])
    assert meta["revision"] == LEARNED_JUDGE_REVISION


def test_artifact_covers_usable_presets_only():
    model = load_model()
    usable = {c for c, p in PRESETS.items() if p.is_active and p.visibility != "BLOCKED"}

    assert set(model.codes) == usable
    width = 512 + model.hash_dimension + 2 * len(usable)
    assert model.weights.shape == (len(usable), width)
    assert model.gate_weights.shape == (width,)
    assert all(model.lexicons)


def test_every_usable_preset_has_at_least_ten_development_positives():
    meta = json.loads((ARTIFACT_DIR / f"{ARTIFACT_NAME}.json").read_text(encoding="utf-8"))
    positives = meta["trained_on"]["positives_per_preset"]

    assert min(positives.values()) >= 15
    assert meta["trained_on"]["notes_without_keyword"] >= 50


def test_recorded_settings_are_the_cross_validation_best_under_the_stated_rule():
    meta = json.loads((ARTIFACT_DIR / f"{ARTIFACT_NAME}.json").read_text(encoding="utf-8"))
    best = meta["cross_validation"]["best"]
    model = load_model()

    assert best["no_keyword_kept_empty"] >= 0.85
    assert meta["cross_validation"]["top_30"][0]["f1"] >= best["f1"]
    assert model.gate_threshold == pytest.approx(best["gate_threshold"])
    assert model.top1_floor == pytest.approx(best["top1_floor"])
    assert model.max_selected == best["max_selected"]
    recorded = meta["decision"]["thresholds"]
    assert np.allclose(model.thresholds, [recorded[c] for c in model.codes])


def test_own_thresholds_only_for_presets_with_enough_positives():
    """Below ``OWN_THRESHOLD_POSITIVES`` development positives a preset keeps the common
    threshold (the stated fallback rule)."""
    from bench.train_judge import OWN_THRESHOLD_POSITIVES

    meta = json.loads((ARTIFACT_DIR / f"{ARTIFACT_NAME}.json").read_text(encoding="utf-8"))
    positives = meta["trained_on"]["positives_per_preset"]
    decision = meta["decision"]

    for code, threshold in decision["thresholds"].items():
        if positives[code] < OWN_THRESHOLD_POSITIVES or not meta["own_thresholds"]["shipped"]:
            assert threshold == pytest.approx(decision["threshold"]), code


def test_note_features_are_the_sentence_vector_the_hashing_vector_then_the_words():
    vector = np.linspace(-1, 1, 512, dtype=np.float32)
    model = load_model()
    lemmas = shared_analyser().analyse("콘센트 많음")

    features = note_features(vector, "콘센트 많음", 1024, lemmas, model.lexicons)

    assert features.shape == (1536 + 2 * len(model.codes),)
    assert np.array_equal(features[:512], vector)
    assert np.array_equal(features[512:1536], hash_embed("콘센트 많음", 1024))
    assert np.array_equal(features[1536:], word_features(lemmas, model.lexicons))
    assert not note_features(vector, "   ", 1024, [], model.lexicons)[512:].any()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("조용하지 않음. 음악이 커서", "  않음. 음악이 커서"),
        ("커피는 별로", "  별로"),
        ("콘센트가 하나도 없어서 나옴", "  하나도 없어서 나옴"),
        ("조용하고 아늑함", "조용하고 아늑함"),
    ],
)
def test_negated_words_are_dropped_from_the_hashed_text(text, expected):
    assert without_negated_words(text, shared_analyser().analyse(text)) == expected


def test_the_ngrams_are_those_of_the_note_without_its_negated_words():
    """Revision 4: "조용하지 않음" puts no n-gram of 조용 into the features."""
    vector = np.zeros(512, np.float32)
    text = "조용하지 않음. 음악이 커서"
    lemmas = shared_analyser().analyse(text)
    lexicons = load_model().lexicons

    dropped = note_features(vector, text, 1024, lemmas, lexicons)[512:1536]
    whole = note_features(vector, text, 1024, lemmas, lexicons, drop_negated_ngrams=False)

    assert np.array_equal(dropped, hash_embed("  않음. 음악이 커서", 1024))
    assert np.array_equal(whole[512:1536], hash_embed(text, 1024))
    assert not np.array_equal(dropped, whole[512:1536])


def _word_evidence(text: str) -> dict[str, tuple[float, float]]:
    """code -> (said, only negated) for ``text`` against the shipped lexicons."""
    model = load_model()
    n = len(model.codes)
    words = word_features(shared_analyser().analyse(text), model.lexicons)
    return {code: (float(words[j]), float(words[n + j])) for j, code in enumerate(model.codes)}


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("진짜 아늑했음", "COZY"),
        ("아늑한 자리", "COZY"),
        ("스콘이랑 라떼 맛있음", "DESSERT_COFFEE"),
        ("힘든 날 위로받음", "NEED_COMFORT"),
        ("빗소리 들으며", "RAINY_DAY"),
    ],
)
def test_lexicon_hits_come_from_inflected_forms(text, code):
    assert _word_evidence(text)[code] == (1.0, 0.0)


@pytest.mark.parametrize(
    ("text", "code"),
    [("조용하지 않음", "QUIET"), ("별로 안 아늑함", "COZY"), ("애견 동반 불가", "WITH_PETS")],
)
def test_a_negated_cue_is_no_evidence_for_its_preset(text, code):
    assert _word_evidence(text)[code] == (0.0, 1.0)


@pytest.mark.parametrize(
    ("text", "code", "selected"),
    [
        ("카페가 조용해서 좋았음", "QUIET", True),
        ("카페가 조용하지 않음, 시끄러웠음", "QUIET", False),
        ("진짜 아늑했음", "COZY", True),
        ("별로 안 아늑했음", "COZY", False),
        ("노트북 작업하기 좋고 콘센트 많음", "STUDY_WORK", True),
        ("노트북 가져갔는데 콘센트가 하나도 없음", "STUDY_WORK", False),
        ("라떼가 진짜 맛있음", "DESSERT_COFFEE", True),
        ("커피는 별로", "DESSERT_COFFEE", False),
    ],
)
async def test_the_shipped_judge_reads_the_word_and_its_negation(text, code, selected):
    """Issue 32: "아늑했음" is COZY's word; "조용하지 않음" and "별로 안 아늑" are no
    evidence for QUIET or COZY (every usable preset a candidate, as offline)."""
    codes = [c for c, p in PRESETS.items() if p.is_active and p.visibility != "BLOCKED"]

    verdict = await _judge().judge(text, [_candidate(c) for c in codes])

    assert (PRESETS[code].id in {s.keyword_id for s in verdict.selected}) is selected


async def test_selects_the_fitting_preset_with_a_probability_as_confidence():
    verdict = await _judge().judge(
        "강아지랑 같이 들어갈 수 있어서 좋았음", [_candidate("WITH_PETS"), _candidate("READING")]
    )

    assert [s.keyword_id for s in verdict.selected] == [PRESETS["WITH_PETS"].id]
    assert 0.0 <= verdict.selected[0].confidence <= 1.0
    assert verdict.unmatched_concepts == ()


async def test_chooses_only_among_the_candidates_it_is_given():
    """The note is about pets; without that candidate nothing outside the set appears."""
    verdict = await _judge().judge("강아지랑 같이 들어갈 수 있어서 좋았음", [_candidate("READING")])

    assert {s.keyword_id for s in verdict.selected} <= {PRESETS["READING"].id}


async def test_a_facility_only_note_gets_no_keyword():
    codes = [c for c, p in PRESETS.items() if p.is_active and p.visibility != "BLOCKED"]
    note = "카드 결제 안 되고 현금만 받아요"

    verdict = await _judge().judge(note, [_candidate(c) for c in codes])

    assert verdict.selected == ()


@pytest.mark.parametrize(("similarity", "selected"), [(0.27, True), (0.25, False)])
async def test_untrained_preset_falls_back_to_the_similarity_rule(similarity, selected):
    new = JudgeCandidate(900, "새 프리셋", "ACTIVITY", "학습에 없던 프리셋", ("예",), similarity)

    verdict = await _judge(fallback=0.26).judge("아무 메모", [new])

    assert ([s.keyword_id for s in verdict.selected] == [900]) is selected


def test_an_artifact_of_another_revision_is_refused():
    with pytest.raises(ConfigurationError, match="revision"):
        LearnedJudge(
            shared_encoder(),
            load_model(),
            shared_analyser(),
            fallback_threshold=0.3,
            profile="p",
            revision=LEARNED_JUDGE_REVISION + 1,
        )


def test_a_missing_artifact_is_a_configuration_error(tmp_path):
    with pytest.raises(ConfigurationError, match="unreadable"):
        load_model(tmp_path)


def test_probabilities_are_finite_for_extreme_inputs():
    model = load_model()

    extreme = np.full(model.width, 1e6, np.float32)

    assert np.isfinite(model.probability(0, extreme))
    assert np.isfinite(model.gate(extreme))


def _toy_model(**changes) -> JudgeModel:
    """A real JudgeModel with readable weights: the preset probabilities are set by biases
    (weights 0), the gate by its bias; every code of the shipped list is trained."""
    shipped = load_model()
    n, width = len(shipped.codes), shipped.width
    model = JudgeModel(
        codes=shipped.codes,
        lexicons=shipped.lexicons,
        weights=np.zeros((n, width), np.float32),
        biases=np.full(n, -5.0, np.float32),  # p = 0.007 for every preset
        thresholds=np.full(n, 0.5, np.float32),
        gate_weights=np.zeros(width, np.float32),
        gate_bias=5.0,  # gate = 0.993
        gate_threshold=0.5,
        top1_floor=1.01,
        max_selected=5,
        hash_dimension=shipped.hash_dimension,
        revision=shipped.revision,
    )
    return dataclasses.replace(model, **changes)


def _biases(**logits: float) -> np.ndarray:
    model = load_model()
    biases = np.full(len(model.codes), -5.0, np.float32)
    for code, logit in logits.items():
        biases[model.index(code)] = logit
    return biases


async def test_at_most_max_selected_are_kept_highest_probability_first():
    model = _toy_model(biases=_biases(QUIET=3.0, COZY=2.0, READING=1.0), max_selected=2)
    candidates = [_candidate(c) for c in ("READING", "COZY", "QUIET", "WITH_PETS")]

    verdict = await _judge(model=model).judge("아무 메모", candidates)

    assert [s.keyword_id for s in verdict.selected] == [PRESETS["QUIET"].id, PRESETS["COZY"].id]


async def test_a_closed_gate_keeps_trained_presets_out_but_not_the_fallback():
    model = _toy_model(biases=_biases(QUIET=3.0), gate_bias=-3.0)
    new = JudgeCandidate(900, "새 프리셋", "ACTIVITY", "학습에 없던 프리셋", ("예",), 0.9)

    verdict = await _judge(model=model).judge("아무 메모", [_candidate("QUIET"), new])

    assert [s.keyword_id for s in verdict.selected] == [900]


@pytest.mark.parametrize(("floor", "selected"), [(0.3, True), (0.5, False)])
async def test_when_none_reaches_its_threshold_the_best_is_taken_above_the_floor(floor, selected):
    # COZY at p = 0.40 (below the 0.5 threshold), READING at 0.27.
    model = _toy_model(biases=_biases(COZY=-0.405, READING=-1.0), top1_floor=floor)

    verdict = await _judge(model=model).judge(
        "아무 메모", [_candidate("READING"), _candidate("COZY")]
    )

    expected = [PRESETS["COZY"].id] if selected else []
    assert [s.keyword_id for s in verdict.selected] == expected


async def test_the_best_one_rule_still_chooses_only_among_the_candidates():
    model = _toy_model(biases=_biases(COZY=-0.405, READING=-1.0), top1_floor=0.2)

    verdict = await _judge(model=model).judge("아무 메모", [_candidate("READING")])

    assert [s.keyword_id for s in verdict.selected] == [PRESETS["READING"].id]


async def test_serving_rule_equals_the_rule_tuned_by_cross_validation():
    """The worker's decision on development notes is the trainer's ``decide`` on the same
    probabilities, so the cross-validation figures describe what is served."""
    from bench.train_judge import decide

    model = load_model()
    notes = yaml.safe_load((EVAL_DIR / "dev.yaml").read_text(encoding="utf-8"))["notes"][::12]
    codes = list(model.codes)
    candidates = [_candidate(c) for c in codes]
    vectors = await shared_encoder().encode([n["text"] for n in notes])
    texts = [n["text"] for n in notes]
    analyser = shared_analyser()
    features = np.array(
        [
            note_features(
                v,
                t,
                model.hash_dimension,
                analyser.analyse(t),
                model.lexicons,
                drop_negated_ngrams=model.drop_negated_ngrams,
            )
            for v, t in zip(vectors, texts, strict=True)
        ]
    )
    probabilities = 1.0 / (1.0 + np.exp(-(features @ model.weights.T + model.biases)))
    gate = 1.0 / (1.0 + np.exp(-(features @ model.gate_weights + model.gate_bias)))
    expected = decide(
        probabilities,
        gate,
        model.thresholds,
        model.gate_threshold,
        model.top1_floor,
        model.max_selected,
    )
    judge = _judge(model=model)

    for row, note in enumerate(notes):
        verdict = await judge.judge(note["text"], candidates)
        got = {s.keyword_id for s in verdict.selected}
        assert got == {PRESETS[codes[j]].id for j in np.flatnonzero(expected[row])}, note


def test_shipped_lexicons_leave_out_praise_and_plain_time_words():
    """Revision 4: "뷰가 미쳤음" in NICE_VIEW's examples does not make 미치다 a view word, nor
    "늦은 밤에" in LATE_NIGHT's description make 밤 one; desserts besides coffee and cake are
    DESSERT_COFFEE's words."""
    lexicons = dict(zip(load_model().codes, load_model().lexicons, strict=True))

    assert "미치다" not in lexicons["NICE_VIEW"]
    assert "밤" not in lexicons["LATE_NIGHT"]
    assert {"새벽", "심야"} <= lexicons["LATE_NIGHT"]
    assert {"티라미수", "마카롱", "빙수"} <= lexicons["DESSERT_COFFEE"]
