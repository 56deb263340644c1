"""The offline hashing embedder (CONTRACT §5; FC-04)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from app.errors import PermanentError
from app.providers.hashing import HashingEmbedder, hash_embed

NOTE = "성수동 조용한 카페에서 친구와 커피를 마셨다"


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b))


def test_hash_embed_is_deterministic_across_processes_and_hash_seeds() -> None:
    script = (
        "import sys; from app.providers.hashing import hash_embed; "
        f"sys.stdout.write(hash_embed({NOTE!r}, 256).tobytes().hex())"
    )
    outputs = {
        subprocess.run(  # noqa: S603 - fixed argv, no shell
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert outputs == {hash_embed(NOTE, 256).tobytes().hex()}


def test_hash_embed_is_unit_norm_float32_of_the_dimension() -> None:
    vector = hash_embed(NOTE, 1536)

    assert vector.dtype == np.float32
    assert vector.shape == (1536,)
    assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-6)


def test_hash_embed_collapses_whitespace_runs() -> None:
    assert np.array_equal(
        hash_embed("  친구와\t\t카페\n에서  ", 512), hash_embed("친구와 카페 에서", 512)
    )


def test_similar_korean_notes_are_closer_than_unrelated_ones() -> None:
    note = hash_embed("성수동 조용한 카페에서 친구와 커피를 마셨다", 1536)
    similar = hash_embed("친구랑 성수 카페에서 조용하게 커피 마심", 1536)
    unrelated = hash_embed("주말에 가족과 한강 공원에서 자전거를 탔다", 1536)

    assert _cosine(note, similar) > _cosine(note, unrelated) + 0.1


@pytest.mark.parametrize("text", ["", "   \n\t"])
def test_text_without_features_is_permanent_error_never_zero_vector_fc04(text: str) -> None:
    with pytest.raises(PermanentError):
        hash_embed(text, 1536)


async def test_embedder_returns_one_vector_per_input_in_input_order() -> None:
    embedder = HashingEmbedder(64)
    texts = ["혼자 책 읽기 좋은 곳", "아이와 함께 간 놀이터", "Late-night ramen ☕"]

    vectors = await embedder.embed(texts)

    assert embedder.dimension == 64
    assert [v.tobytes() for v in vectors] == [hash_embed(t, 64).tobytes() for t in texts]
    await embedder.aclose()


def test_dimension_below_one_is_rejected() -> None:
    with pytest.raises(ValueError, match="dimension"):
        HashingEmbedder(0)
