"""The offline learned judge (§4): what it was trained on, candidates only, fallback rule."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from app.errors import ConfigurationError
from app.providers.base import JudgeCandidate
from app.providers.learned_judge import ARTIFACT_DIR, ARTIFACT_NAME, LearnedJudge, load_model
from app.providers.sentence_encoder import shared_encoder
from app.service.preset_loader import read_preset_file
from app.settings import LEARNED_JUDGE_REVISION

EVAL_DIR = Path(__file__).resolve().parents[2] / "bench" / "keyword_eval"
PRESETS = {p.code: p for p in read_preset_file().presets}


def _candidate(code: str, similarity: float = 0.3) -> JudgeCandidate:
    p = PRESETS[code]
    return JudgeCandidate(
        p.id, p.display_name, p.category, p.description, p.examples, similarity, code=p.code
    )


def _judge(fallback: float = 0.26) -> LearnedJudge:
    return LearnedJudge(
        shared_encoder(),
        load_model(),
        fallback_threshold=fallback,
        profile="local-use-logreg-judge-test",
        revision=LEARNED_JUDGE_REVISION,
    )


def test_artifact_was_trained_on_the_committed_development_part_only():
    meta = json.loads((ARTIFACT_DIR / f"{ARTIFACT_NAME}.json").read_text(encoding="utf-8"))
    dev = (EVAL_DIR / "dev.yaml").read_bytes()

    assert meta["trained_on"]["development_part"] == "dev.yaml"
    assert meta["trained_on"]["sha256"] == hashlib.sha256(dev).hexdigest()
    assert "test" not in json.dumps(meta["trained_on"])
    assert meta["revision"] == LEARNED_JUDGE_REVISION


def test_artifact_covers_usable_presets_only():
    model = load_model()
    usable = {c for c, p in PRESETS.items() if p.is_active and p.visibility != "BLOCKED"}

    assert set(model.codes) == usable
    assert model.weights.shape == (len(usable), 512)


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
            fallback_threshold=0.3,
            profile="p",
            revision=LEARNED_JUDGE_REVISION + 1,
        )


def test_a_missing_artifact_is_a_configuration_error(tmp_path):
    with pytest.raises(ConfigurationError, match="unreadable"):
        load_model(tmp_path)


def test_probabilities_are_finite_for_extreme_inputs():
    model = load_model()

    assert np.isfinite(model.probability(0, np.full(512, 1e6, np.float32)))
