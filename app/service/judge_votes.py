"""Judge voting (``PINLOG_JUDGE_VOTES=N``, odd, default 1): N concurrent judge calls combined
into one verdict.

Each vote is mapped by the §4 rules on its own (``service/judgment.py``: unknown ids, bad
confidences and duplicates dropped). A keyword is kept when a strict majority of the N votes
selects it; its confidence is the median of the agreeing votes' confidences. An unmatched
concept is kept when a strict majority names it (after the same cleaning). Outcomes:

- at least a majority of the calls answered: their combination (a failed call is a vote for
  nothing);
- some answered, fewer than a majority: ``TransientError`` (the stage is retried later);
- none answered: the first call's error, classified as with one judge (a provider-wide answer
  still reaches the gate; an invalid or refused answer still ends the stage).

It costs N times the judge's tokens and calls (each call is metered and counted in the ledger
on its own); whether it improves precision has to be measured against a real provider (the
fake provider's votes are scripted).
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
from collections import Counter
from collections.abc import Sequence

from app.errors import TransientError
from app.providers.base import JudgeCandidate, JudgeSelection, JudgeVerdict, KeywordJudge
from app.service.judgment import MappedJudgment, map_verdict


class VotingJudge:
    """A ``KeywordJudge`` asking ``judge`` ``votes`` times concurrently (module docstring)."""

    def __init__(self, judge: KeywordJudge, votes: int) -> None:
        if votes < 1 or votes % 2 == 0:
            raise ValueError("votes must be odd and at least 1")
        self.judge_provider = judge
        self.votes = votes

    @property
    def profile(self) -> str:
        return self.judge_provider.profile

    async def judge(self, text: str, candidates: Sequence[JudgeCandidate]) -> JudgeVerdict:
        if self.votes == 1 or not candidates:
            return await self.judge_provider.judge(text, candidates)
        answers = await asyncio.gather(
            *(self.judge_provider.judge(text, candidates) for _ in range(self.votes)),
            return_exceptions=True,
        )
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, Exception):
                raise answer  # cancellation and the like
        verdicts = [a for a in answers if isinstance(a, JudgeVerdict)]
        if not verdicts:
            raise answers[0]
        if 2 * len(verdicts) <= self.votes:
            raise TransientError(
                f"judge votes: {len(verdicts)} of {self.votes} calls answered, no majority"
            )
        ids = [c.id for c in candidates]
        combined = combine([map_verdict(v, ids) for v in verdicts], self.votes)
        profiles = {v.profile for v in verdicts}
        if len(profiles) == 1:  # every vote from one judge of a chain: name it
            return dataclasses.replace(combined, profile=profiles.pop())
        return combined

    async def aclose(self) -> None:
        """The wrapped judge is closed by its owner."""


def combine(votes: Sequence[MappedJudgment], total: int) -> JudgeVerdict:
    """The majority verdict of ``votes`` out of ``total`` calls (module docstring)."""
    confidences: dict[int, list[float]] = {}
    concepts: Counter[str] = Counter()
    for vote in votes:
        for keyword_id, confidence in vote.selections:
            confidences.setdefault(keyword_id, []).append(confidence)
        concepts.update(set(vote.unmatched_concepts))
    kept = sorted(
        (
            (keyword_id, float(statistics.median(values)))
            for keyword_id, values in confidences.items()
            if 2 * len(values) > total
        ),
        key=lambda pair: (-pair[1], pair[0]),
    )
    return JudgeVerdict(
        selected=tuple(JudgeSelection(keyword_id, conf) for keyword_id, conf in kept),
        unmatched_concepts=tuple(c for c, n in concepts.items() if 2 * n > total),
    )
