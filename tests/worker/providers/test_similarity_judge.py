"""The offline similarity judge and the provider factory (CONTRACT §4)."""

from __future__ import annotations

from app.metrics import WorkerMetrics
from app.providers.base import JudgeCandidate, JudgeSelection
from app.providers.factory import build_embedding_provider, build_judge
from app.providers.hashing import HashingEmbedder
from app.providers.similarity_judge import SimilarityJudge
from app.settings import OFFLINE_EMBEDDING_MODEL, OFFLINE_PROFILE, Settings

PROFILE = "local-similarity-judge-test-v1"


def _candidate(keyword_id: int, similarity: float) -> JudgeCandidate:
    return JudgeCandidate(keyword_id, f"kw{keyword_id}", "ACTIVITY", "desc", ("ex",), similarity)


def _offline_settings(threshold: float) -> Settings:
    return Settings(
        database_url="postgresql+asyncpg://u:p@localhost/db",
        internal_secret="provider-test-internal-secret-0123456789",
        embedding_provider="hashing",
        embedding_model=OFFLINE_EMBEDDING_MODEL,
        embedding_profile=OFFLINE_PROFILE,
        judge_provider="similarity",
        judge_similarity_threshold=threshold,
    )


async def test_selects_candidates_at_or_above_threshold_highest_first() -> None:
    judge = SimilarityJudge(0.4, profile=PROFILE)
    candidates = [_candidate(1, 0.39), _candidate(2, 0.4), _candidate(3, 0.85), _candidate(4, 0.7)]

    verdict = await judge.judge("메모", candidates)

    assert [s.keyword_id for s in verdict.selected] == [3, 4, 2]
    assert verdict.unmatched_concepts == ()


async def test_confidence_maps_threshold_to_half_and_one_to_one_rounded() -> None:
    judge = SimilarityJudge(0.4, profile=PROFILE)
    candidates = [_candidate(1, 0.4), _candidate(2, 0.7), _candidate(3, 1.0), _candidate(4, 1.0001)]

    verdict = await judge.judge("메모", candidates)

    assert sorted(verdict.selected, key=lambda s: s.keyword_id) == [
        JudgeSelection(1, 0.5),
        JudgeSelection(2, 0.75),
        JudgeSelection(3, 1.0),
        JudgeSelection(4, 1.0),
    ]


async def test_selects_at_most_five() -> None:
    judge = SimilarityJudge(0.1, profile=PROFILE)
    candidates = [_candidate(i, 0.2 + i / 100) for i in range(1, 9)]

    verdict = await judge.judge("메모", candidates)

    assert [s.keyword_id for s in verdict.selected] == [8, 7, 6, 5, 4]


async def test_nan_similarity_is_never_selected_fc04() -> None:
    verdict = await SimilarityJudge(0.3, profile=PROFILE).judge(
        "메모", [_candidate(1, float("nan"))]
    )

    assert verdict.selected == ()


def test_factory_builds_offline_providers_with_matching_profile() -> None:
    settings = _offline_settings(0.35)

    embedder = build_embedding_provider(settings)
    judge = build_judge(settings, WorkerMetrics())

    assert isinstance(embedder, HashingEmbedder)
    assert embedder.dimension == settings.embedding_dimension
    assert isinstance(judge, SimilarityJudge)
    assert judge.profile == settings.judge_profile == "local-similarity-judge-0.35-v1"
