"""The fallback judge chain (``PINLOG_JUDGE_FALLBACKS``): the configured judge first, then each
fallback in order, each behind its own circuit (a ``ProviderGate``).

For one request the first judge whose circuit is closed is asked; a transient or provider-wide
failure, an open circuit, or an invalid, refused or truncated answer moves to the next judge,
which answers the same request. The verdict names the judge that answered (``profile``, stored
as ``model_profile``). When none answered: if every judge was asked and each gave an invalid,
refused or truncated answer, the first of those errors (the stage ends ``judge_output_invalid``,
``judge_refused`` or ``judge_truncated``); otherwise a transient error (a judge that was not
asked, or failed transiently, may answer later). An answer about the note itself
(``InvalidInputError``) is the note's, not the judge's: raised at once.

``AnyJudgeGate`` is the ``judge`` gate of ``/readyz``, the routes and the keyword stage while a
chain is configured: available while any judge's circuit is closed (and no daily cap holds).
Embedding fallbacks are not possible: another embedding model is another profile (§5).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import TypeVar

from app.errors import (
    InvalidInputError,
    InvalidOutputError,
    JudgeRefusedError,
    JudgeTruncatedError,
    ProviderGateClosed,
    TransientError,
)
from app.providers.base import JudgeCandidate, JudgeVerdict, KeywordJudge
from app.service.provider_gate import ProviderGate

T = TypeVar("T")
_ANSWER_ERRORS = (InvalidOutputError, JudgeRefusedError, JudgeTruncatedError)


class JudgeChain:
    """A ``KeywordJudge`` over ``links``: ``(judge, its gate)`` in order (module docstring)."""

    def __init__(self, links: Sequence[tuple[KeywordJudge, ProviderGate]]) -> None:
        self.links = tuple(links)
        self.profile = self.links[0][0].profile

    async def judge(self, text: str, candidates: Sequence[JudgeCandidate]) -> JudgeVerdict:
        answer_errors: list[Exception] = []
        other: Exception | None = None
        for judge, gate in self.links:
            if not gate.available:
                other = other or ProviderGateClosed(
                    "judge unavailable", retry_after_seconds=gate.retry_after_seconds() or 1
                )
                continue
            try:
                verdict = await gate.call(lambda judge=judge: judge.judge(text, candidates))
            except InvalidInputError:
                raise
            except _ANSWER_ERRORS as exc:
                answer_errors.append(exc)
                continue
            except TransientError as exc:
                other = other or exc
                continue
            return replace(verdict, profile=judge.profile)
        if other is None and answer_errors:
            raise answer_errors[0]
        if other is not None and not answer_errors:
            raise other
        raise TransientError(
            f"judge chain: {len(answer_errors)} invalid answer(s), other judges unavailable"
        )

    async def aclose(self) -> None:
        """The judges are closed by their owner."""


class AnyJudgeGate:
    """The ``judge`` gate while a chain is configured: the ``ProviderGate`` interface over the
    chain's gates; ``call`` runs the operation when any of them is available (each judge's own
    gate counts its faults inside the chain)."""

    def __init__(self, gates: Sequence[ProviderGate]) -> None:
        self.name = "judge"
        self._gates = tuple(gates)

    @property
    def available(self) -> bool:
        return any(gate.available for gate in self._gates)

    @property
    def reason(self) -> str | None:
        return None if self.available else self._gates[0].reason

    def retry_after_seconds(self) -> int | None:
        if self.available:
            return None
        waits = [w for gate in self._gates if (w := gate.retry_after_seconds()) is not None]
        return min(waits) if waits else 1

    async def call(self, operation: Callable[[], Awaitable[T]]) -> T:
        if not self.available:
            raise ProviderGateClosed(
                "judge provider unavailable",
                retry_after_seconds=max(1, math.ceil(self.retry_after_seconds() or 1)),
            )
        return await operation()

    async def aclose(self) -> None:
        """Each gate is closed by its owner."""
