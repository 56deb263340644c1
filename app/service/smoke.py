"""``pinlog-ai smoke``: one real embedding call and one real judge call.

A deploy's release step: against the configured providers, with a fixed harmless text, it
checks what serving will rely on and prints one line per check. Nothing touches the database
(no connection is opened). Checks, in order:

- ``embedding call``: the provider answered;
- ``embedding dimension``: the vector has ``PINLOG_EMBEDDING_DIMENSION`` values (stored padded
  to the column width);
- ``embedding profile``: the answer's ``model`` (when the provider names one) is the profile's
  model;
- ``embedding latency``: the call took at most ``--max-latency-seconds``;
- ``judge call``, ``judge output`` (the structured-output contract of §4: a parseable verdict
  whose every selection names an offered candidate with a confidence in 0..1), ``judge latency``.

A check that cannot run because its call failed is printed as ``skip``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from app.errors import DimensionMismatchError, PermanentError, TransientError
from app.providers.base import EmbeddingProvider, JudgeCandidate, KeywordJudge
from app.providers.usage import CollectingSink, current_stage
from app.service.judgment import map_verdict

SMOKE_TEXT = "A quiet café by the river; we had coffee and cake on the terrace in the sun."
SMOKE_CANDIDATES = (
    JudgeCandidate(
        id=1, display_name="Coffee", category="food", description="Coffee or a café",
        examples=("had a latte",), similarity=0.6, code="smoke_coffee",
    ),
    JudgeCandidate(
        id=2, display_name="Quiet", category="atmosphere", description="A calm, quiet place",
        examples=("peaceful",), similarity=0.5, code="smoke_quiet",
    ),
    JudgeCandidate(
        id=3, display_name="Nightlife", category="activity", description="Bars and clubs",
        examples=("danced all night",), similarity=0.1, code="smoke_nightlife",
    ),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    outcome: str  # "ok", "FAIL" or "skip"
    detail: str

    @property
    def line(self) -> str:
        return f"{self.outcome:<4} {self.name}: {self.detail}"


@dataclass(frozen=True, slots=True)
class SmokeReport:
    checks: tuple[Check, ...]

    @property
    def passed(self) -> bool:
        return all(check.outcome == "ok" for check in self.checks)


def _failure(exc: BaseException) -> str:
    # Our errors carry fixed messages (layer, status, our label): never upstream text or keys.
    return str(exc) if isinstance(exc, TransientError | PermanentError) else type(exc).__name__


def _latency(name: str, seconds: float, limit: float) -> Check:
    detail = f"{seconds:.2f} s (limit {limit:g} s)"
    return Check(name, "ok" if seconds <= limit else "FAIL", detail)


async def run_smoke(
    embedder: EmbeddingProvider,
    judge: KeywordJudge,
    sink: CollectingSink,
    *,
    model: str,
    dimension: int,
    vector_dimension: int,
    max_latency_seconds: float,
) -> SmokeReport:
    """The checks against ``embedder`` and ``judge`` (built from the settings, ``sink``
    attached to the OpenAI-compatible ones); ``model`` and ``dimension``: the embedding
    profile's."""
    token = current_stage.set("smoke")
    try:
        checks = [*await _embedding_checks(
            embedder, sink, model, dimension, vector_dimension, max_latency_seconds
        )]  # fmt: skip
        checks += await _judge_checks(judge, max_latency_seconds)
    finally:
        current_stage.reset(token)
    return SmokeReport(tuple(checks))


async def _embedding_checks(
    embedder: EmbeddingProvider,
    sink: CollectingSink,
    model: str,
    dimension: int,
    vector_dimension: int,
    limit: float,
) -> Sequence[Check]:
    started = time.perf_counter()
    try:
        vectors = await embedder.embed([SMOKE_TEXT])
    except DimensionMismatchError as exc:
        return (
            Check("embedding call", "ok", "answered"),
            Check("embedding dimension", "FAIL", str(exc)),
            Check("embedding profile", "skip", "no usable vector"),
            _latency("embedding latency", time.perf_counter() - started, limit),
        )
    except Exception as exc:
        return (
            Check("embedding call", "FAIL", _failure(exc)),
            *(Check(f"embedding {name}", "skip", "no answer")
              for name in ("dimension", "profile", "latency")),
        )  # fmt: skip
    seconds = time.perf_counter() - started
    width = len(vectors[0]) if len(vectors) == 1 else -1
    checks = [Check("embedding call", "ok", "1 vector")]
    if width == vector_dimension:
        checks.append(Check("embedding dimension", "ok", f"{dimension} (stored as {width})"))
    else:
        checks.append(
            Check("embedding dimension", "FAIL", f"expected {vector_dimension}, got {width}")
        )
    answered = [
        usage.answered_model for stage, usage in sink.calls if usage.provider == "embedding"
    ]
    name = answered[-1] if answered else None
    if name is None:
        checks.append(Check("embedding profile", "ok", f"{model} (the answer names no model)"))
    elif name == model or name.startswith(f"{model}-"):
        checks.append(Check("embedding profile", "ok", name))
    else:
        checks.append(
            Check("embedding profile", "FAIL", f"the profile names {model}, {name} answered")
        )
    checks.append(_latency("embedding latency", seconds, limit))
    return checks


async def _judge_checks(judge: KeywordJudge, limit: float) -> list[Check]:
    started = time.perf_counter()
    try:
        verdict = await judge.judge(SMOKE_TEXT, SMOKE_CANDIDATES)
    except PermanentError as exc:
        # Refused, truncated or still invalid after the re-ask: the call itself was answered.
        return [
            Check("judge call", "ok", "answered"),
            Check("judge output", "FAIL", _failure(exc)),
            _latency("judge latency", time.perf_counter() - started, limit),
        ]
    except Exception as exc:
        return [
            Check("judge call", "FAIL", _failure(exc)),
            Check("judge output", "skip", "no answer"),
            Check("judge latency", "skip", "no answer"),
        ]
    seconds = time.perf_counter() - started
    mapped = map_verdict(verdict, [c.id for c in SMOKE_CANDIDATES])
    if mapped.dropped:
        reasons = ", ".join(
            f"{reason} x{count}" for reason, count in sorted(mapped.dropped.items())
        )
        output = Check("judge output", "FAIL", f"selections outside the contract: {reasons}")
    else:
        output = Check("judge output", "ok", f"{len(mapped.selections)} selection(s), valid")
    return [
        Check("judge call", "ok", f"profile {judge.profile}"),
        output,
        _latency("judge latency", seconds, limit),
    ]
