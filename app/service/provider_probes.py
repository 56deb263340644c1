"""The gates' synthetic probes: the kind of call that failed, never a user's note.

The embedding probe embeds a fixed harmless text; the judge probe asks the configured judge
with a fixed note and one fixed candidate, through the same provider object as the stages, so
the production request parameters (model, ``temperature``, ``response_format``) are the ones
probed. Never the models endpoint: it answers while quota, parameter and format faults
persist.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from app.providers.base import EmbeddingProvider, JudgeCandidate, KeywordJudge

PROBE_TEXT = "PinLog availability probe: a quiet cafe with good coffee."
PROBE_CANDIDATE = JudgeCandidate(
    id=1,
    display_name="Quiet",
    category="ATMOSPHERE",
    description="A calm place with little noise.",
    examples=("a quiet cafe", "calm and peaceful"),
    similarity=1.0,
    code="PINLOG_PROBE",
)


def embedding_probe(provider: EmbeddingProvider) -> Callable[[], Awaitable[object]]:
    """One embedding request of ``PROBE_TEXT`` on ``provider`` (not the stages' batcher)."""
    return lambda: provider.embed([PROBE_TEXT])


def judge_probe(judge: KeywordJudge) -> Callable[[], Awaitable[object]]:
    """One judgment of ``PROBE_TEXT`` against ``PROBE_CANDIDATE`` on ``judge``."""
    return lambda: judge.judge(PROBE_TEXT, [PROBE_CANDIDATE])
