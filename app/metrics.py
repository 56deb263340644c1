"""Prometheus counters of the worker, served at ``GET /metrics``.

Leaf module. Labels never carry ids or text: cardinality stays fixed.
"""

from prometheus_client import Counter, Gauge

STAGE_OUTCOMES = Counter(
    "pinlog_stage_outcomes_total",
    "Stage runs by outcome (completed, failed, transient, discarded, not_claimed, reused)",
    ["stage", "outcome"],
)
RECLAIMS = Counter("pinlog_reclaims_total", "Stale PROCESSING stages taken over (§2)", ["stage"])
CONTRACT_VIOLATIONS = Counter(
    "pinlog_contract_violations_total",
    "Requests that broke the caller contract, e.g. one contextId with two texts (§3)",
    ["kind"],
)
JUDGE_ITEMS_DROPPED = Counter(
    "pinlog_judge_items_dropped_total",
    "Judge output items dropped by the mapping rules of §4",
    ["reason"],
)
REQUESTS_REJECTED = Counter(
    "pinlog_process_requests_rejected_total",
    "Process requests refused before queueing",
    ["reason"],
)
CIRCUIT_OPEN = Gauge(
    "pinlog_circuit_open",
    "1 while a provider's circuit breaker is open or half-open, 0 when closed (§6)",
    ["provider"],
)
JUDGE_REASKS = Counter(
    "pinlog_judge_reasks_total",
    "Judgments asked again because the answer did not parse or had no usable structure (§6)",
)
