"""Prometheus metrics of the worker, on a registry owned by one app instance.

``create_app`` builds one ``WorkerMetrics`` and hands it to every object that counts, by
construction; ``GET /metrics`` serves its registry. A registry per instance keeps two apps in
one process (tests, the demo) from sharing counts.

Labels come from fixed sets only, never ids or text, so the number of series is fixed. The
children counted on the hot path (a few per context) are bound once here: ``.labels()`` per
event would validate and look up the labels under a lock every time.
Leaf module: imports only the leaf modules ``states`` and ``errors``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from app.errors import (
    DimensionMismatchError,
    InvalidInputError,
    InvalidOutputError,
    PermanentError,
    ProfileMismatchError,
    ProviderProtocolError,
    ProviderUnavailableError,
    TransientError,
)
from pinlog_platform.contract.states import Stage
from pinlog_platform.contract.states.failure_reasons import FailureReason

STAGE_OUTCOMES = ("completed", "failed", "transient", "discarded", "not_claimed", "reused")
CONTRACT_VIOLATION_KINDS = ("owner_mismatch", "owner_changed", "text_mismatch", "text_changed")
REJECTION_REASONS = ("queue_full", "shutting_down", "provider_unavailable")
PROVIDER_KINDS = ("embedding", "judge")
# Most specific class first: the first match names the error.
PROVIDER_ERROR_CLASSES: tuple[tuple[type[Exception], str], ...] = (
    (ProviderProtocolError, "protocol"),
    (ProviderUnavailableError, "provider_wide"),
    (DimensionMismatchError, "dimension_mismatch"),
    (InvalidOutputError, "invalid_output"),
    (InvalidInputError, "invalid_input"),
    (PermanentError, "permanent"),
    (TransientError, "transient"),
)
UNEXPECTED = "unexpected"
SEARCH_OUTCOMES = ("ok", "invalid", "provider_failed", "unavailable", "error")
# The HTTP mapping of main.py, by search outcome: 422, 502, 503; anything else is a 500.
_SEARCH_ERROR_OUTCOMES: tuple[tuple[type[Exception], str], ...] = (
    (ProfileMismatchError, "invalid"),
    (InvalidInputError, "invalid"),
    (PermanentError, "provider_failed"),
    (TransientError, "unavailable"),
)

# Seconds. Provider calls run up to PROVIDER_TIMEOUT_SECONDS per attempt, with retries.
PROVIDER_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
SEARCH_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
# A stage run lasts at most its hard deadline, a share of the 600 s processing expiry.
STAGE_SECONDS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# Inputs per embedding request; EMBEDDING_BATCH_SIZE is 16 by default, at most 2048.
BATCH_INPUT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 512, 2048)


def provider_error_class(exc: BaseException) -> str:
    """The ``error`` label of a provider failure: the most specific class of ``app.errors``
    (``protocol``, ``provider_wide``, ``dimension_mismatch``, ``invalid_output``,
    ``invalid_input``, ``permanent``, ``transient``), else ``unexpected`` (a bug of ours or
    of a local model)."""
    for error_class, label in PROVIDER_ERROR_CLASSES:
        if isinstance(exc, error_class):
            return label
    return UNEXPECTED


def search_outcome(exc: BaseException) -> str:
    """The ``outcome`` label of a failed search, matching its HTTP status (``main.py``)."""
    for error_class, label in _SEARCH_ERROR_OUTCOMES:
        if isinstance(exc, error_class):
            return label
    return "error"


class StageMetrics:
    """The children of one stage (label ``stage``), bound once.

    One attribute per outcome of ``STAGE_OUTCOMES`` (a counter each), ``reclaims``,
    ``deadlines`` (counters), ``in_flight`` (a gauge: runs of this stage in progress) and
    ``seconds`` (a histogram: claimed runs from the claim to the save or failure).
    """

    __slots__ = (
        *STAGE_OUTCOMES,
        "deadlines",
        "failure_reasons",
        "in_flight",
        "reclaims",
        "seconds",
    )

    def __init__(self, metrics: WorkerMetrics, stage: Stage) -> None:
        outcomes = metrics.stage_outcomes
        self.completed = outcomes.labels(stage.label, "completed")
        self.failed = outcomes.labels(stage.label, "failed")
        self.transient = outcomes.labels(stage.label, "transient")
        self.discarded = outcomes.labels(stage.label, "discarded")
        self.not_claimed = outcomes.labels(stage.label, "not_claimed")
        self.reused = outcomes.labels(stage.label, "reused")
        self.reclaims = metrics.reclaims.labels(stage.label)
        self.deadlines = metrics.stage_deadlines.labels(stage.label)
        self.in_flight = metrics.stages_in_flight.labels(stage.label)
        self.seconds = metrics.stage_seconds.labels(stage.label)
        self.failure_reasons = {
            reason: metrics.stage_failures.labels(stage.label, reason.value)
            for reason in FailureReason
        }


class ProviderMetrics:
    """The children of one provider kind (``embedding`` or ``judge``): call latency by
    outcome (``ok``, ``error``, ``cancelled``) and errors by class, bound once."""

    __slots__ = ("_cancelled", "_errors", "_failed", "_ok")

    def __init__(self, metrics: WorkerMetrics, kind: str) -> None:
        self._ok = metrics.provider_seconds.labels(kind, "ok")
        self._failed = metrics.provider_seconds.labels(kind, "error")
        self._cancelled = metrics.provider_seconds.labels(kind, "cancelled")
        self._errors = {
            label: metrics.provider_errors.labels(kind, label)
            for label in (*(label for _, label in PROVIDER_ERROR_CLASSES), UNEXPECTED)
        }

    def succeeded(self, seconds: float) -> None:
        """One call answered in ``seconds``."""
        self._ok.observe(seconds)

    def failed(self, seconds: float, exc: BaseException) -> None:
        """One call ended after ``seconds`` with ``exc``: counted by its class."""
        self._failed.observe(seconds)
        self._errors[provider_error_class(exc)].inc()

    def cancelled(self, seconds: float) -> None:
        """One call abandoned after ``seconds`` (stage deadline, shutdown): no provider error."""
        self._cancelled.observe(seconds)


class WorkerMetrics:
    """Every metric of the worker, registered on ``registry`` (a new one when not given).

    Names and labels are listed in ``docs/operations.md``. ``queue_depth`` is filled in by
    the ``WorkerPool`` (read when scraped, no cost per request).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.stage_outcomes = Counter(
            "pinlog_stage_outcomes_total",
            "Stage runs by outcome (completed, failed, transient, discarded, not_claimed, reused)",
            ["stage", "outcome"],
            registry=self.registry,
        )
        self.reclaims = Counter(
            "pinlog_reclaims_total",
            "Stale PROCESSING stages taken over (§2)",
            ["stage"],
            registry=self.registry,
        )
        self.stage_deadlines = Counter(
            "pinlog_stage_deadlines_exceeded_total",
            "Stage runs abandoned at their hard deadline, left PROCESSING (§2); also transient",
            ["stage"],
            registry=self.registry,
        )
        self.request_deadlines = Counter(
            "pinlog_request_deadlines_exceeded_total",
            "HTTP requests answered 503 at their overall deadline",
            registry=self.registry,
        )
        self.stage_failures = Counter(
            "pinlog_stage_failures_total",
            "Stages this worker marked FAILED, by stage and failure reason code",
            ["stage", "reason"],
            registry=self.registry,
        )
        self.stages_in_flight = Gauge(
            "pinlog_stages_in_flight",
            "Stage runs in progress in this process, from the claim to the save or failure",
            ["stage"],
            registry=self.registry,
        )
        self.stage_seconds = Histogram(
            "pinlog_stage_seconds",
            "Stage runs this worker claimed, in seconds from the claim to the save or the "
            "failure (provider calls, pool and lock waits included), by stage",
            ["stage"],
            buckets=STAGE_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self.backfill_contexts = Counter(
            "pinlog_backfill_contexts_total",
            "Contexts of re-embedding backfill batches by result (completed, cancelled, failed, "
            "not_claimed, lost, put_back; by the Batch API also batched and returned)",
            ["result"],
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "pinlog_queue_depth",
            "Process requests queued and not yet taken by a worker task",
            registry=self.registry,
        )
        self.requests_rejected = Counter(
            "pinlog_process_requests_rejected_total",
            "Process requests refused before queueing (503), by reason",
            ["reason"],
            registry=self.registry,
        )
        self.contract_violations = Counter(
            "pinlog_contract_violations_total",
            "Requests that broke the caller contract, e.g. one contextId with two texts (§3)",
            ["kind"],
            registry=self.registry,
        )
        self.judge_items_dropped = Counter(
            "pinlog_judge_items_dropped_total",
            "Judge output items dropped by the mapping rules of §4",
            ["reason"],
            registry=self.registry,
        )
        self.judge_reasks = Counter(
            "pinlog_judge_reasks_total",
            "Judgments asked again because the answer did not parse or had no usable structure "
            "(§6)",
            registry=self.registry,
        )
        self.circuit_open = Gauge(
            "pinlog_circuit_open",
            "1 while a provider's gate is open (provider unavailable, probing), else 0 (§6)",
            ["provider"],
            registry=self.registry,
        )
        self.provider_seconds = Histogram(
            "pinlog_provider_call_seconds",
            "Provider call latency in seconds (retries within the call included), by provider "
            "kind and outcome (ok, error, cancelled)",
            ["provider", "outcome"],
            buckets=PROVIDER_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self.provider_errors = Counter(
            "pinlog_provider_errors_total",
            "Failed provider calls by provider kind and error class of app.errors",
            ["provider", "error"],
            registry=self.registry,
        )
        self.provider_tokens = Counter(
            "pinlog_provider_tokens_total",
            "Tokens of answered provider calls (from the answer's usage, or estimated as UTF-8 "
            "bytes / 3 when it has none), by provider kind, model, calling stage and kind "
            "(prompt, completion, embedding; cached_prompt: the part of prompt or embedding read "
            "from the provider's prompt cache)",
            ["provider", "model", "stage", "kind"],
            registry=self.registry,
        )
        self.spend_capped = Gauge(
            "pinlog_provider_spend_capped",
            "1 while a provider's daily token cap is reached (unavailable until the next UTC "
            "day), else 0",
            ["provider"],
            registry=self.registry,
        )
        self.daily_token_cap = Gauge(
            "pinlog_provider_daily_token_cap",
            "A provider's daily token cap (PINLOG_EMBEDDING_DAILY_TOKEN_CAP, "
            "PINLOG_JUDGE_DAILY_TOKEN_CAP); 0 when there is none",
            ["provider"],
            registry=self.registry,
        )
        self.tokens_today = Gauge(
            "pinlog_provider_tokens_today",
            "A provider's tokens of the UTC day over every worker process, as the spend guard "
            "counts them (the ledger as last read, plus this process's calls since)",
            ["provider"],
            registry=self.registry,
        )
        self.provider_unavailable = Gauge(
            "pinlog_provider_unavailable",
            "1 for the reason a provider's gate refuses calls now (a provider-wide fault, "
            "rate_limited, daily_token_cap), 0 for the other reasons; set when scraped",
            ["provider", "reason"],
            registry=self.registry,
        )
        self.database_up = Gauge(
            "pinlog_database_up",
            "1 when the database answered the readiness check at the last scrape, else 0",
            registry=self.registry,
        )
        self.embedding_batch_inputs = Histogram(
            "pinlog_embedding_batch_inputs",
            "Inputs per embedding provider request (stages sharing one request, or a query)",
            buckets=BATCH_INPUT_BUCKETS,
            registry=self.registry,
        )
        self.search_seconds = Histogram(
            "pinlog_search_seconds",
            "Personal search latency in seconds, by outcome (ok 200, invalid 422, "
            "provider_failed 502, unavailable 503, error 500)",
            ["outcome"],
            buckets=SEARCH_SECONDS_BUCKETS,
            registry=self.registry,
        )
        self.http_requests = Histogram(
            "pinlog_http_request_seconds",
            "HTTP request latency in seconds, by route template, method and status class",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.stages = {stage: StageMetrics(self, stage) for stage in Stage}
        self.providers = {kind: ProviderMetrics(self, kind) for kind in PROVIDER_KINDS}
        self.search = {outcome: self.search_seconds.labels(outcome) for outcome in SEARCH_OUTCOMES}
        self.rejected = {
            reason: self.requests_rejected.labels(reason) for reason in REJECTION_REASONS
        }
        self.violations = {
            kind: self.contract_violations.labels(kind) for kind in CONTRACT_VIOLATION_KINDS
        }
