"""Prometheus metrics of the core service, on a registry owned by one app instance.

A registry per instance keeps tests isolated (two apps in one process never share counts).
Labels never carry ids or text.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram


class CoreMetrics:
    """Counters of lifecycle operations, dispatches, rescans and finalized stages."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.lifecycle_operations = Counter(
            "pinlog_core_lifecycle_operations_total",
            "Context lifecycle operations by operation and outcome",
            ["operation", "outcome"],
            registry=self.registry,
        )
        self.dispatches = Counter(
            "pinlog_core_dispatches_total",
            "Requests to the worker's process endpoint by origin and result",
            ["origin", "result"],
            registry=self.registry,
        )
        self.rescan_claims = Counter(
            "pinlog_core_rescan_claims_total",
            "Stale state rows claimed by the rescan (one retry spent each)",
            registry=self.registry,
        )
        self.http_requests = Histogram(
            "pinlog_core_http_request_seconds",
            "Client API request latency in seconds, by route template, method and status class",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.request_deadlines = Counter(
            "pinlog_core_request_deadlines_exceeded_total",
            "HTTP requests answered 503 at their overall deadline",
            registry=self.registry,
        )
        self.commits_outcome_unknown = Counter(
            "pinlog_core_commits_outcome_unknown_total",
            "Commits of a request whose connection failed during COMMIT (answered 503)",
            registry=self.registry,
        )
        self.finalized = Counter(
            "pinlog_core_finalized_total",
            "State rows closed by the finalizer, by reason",
            ["reason"],
            registry=self.registry,
        )
