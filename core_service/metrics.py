"""Prometheus metrics of the core service, on a registry owned by one app instance.

A registry per instance keeps tests isolated (two apps in one process never share counts).
Labels never carry ids or text.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


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
        self.create_step_by_step = Counter(
            "pinlog_core_create_step_by_step_total",
            "Creates that met a place or record committed concurrently and ran step by step",
            registry=self.registry,
        )
        self.dispatches = Counter(
            "pinlog_core_dispatches_total",
            "Requests to the worker's process endpoint by origin and result",
            ["origin", "result"],
            registry=self.registry,
        )
        self.retry_set_size = Gauge(
            "pinlog_core_dispatch_retry_set_size",
            "Refused dispatches this process holds to send again (at most DISPATCH_RETRY_CAPACITY)",
            registry=self.registry,
        )
        self.dispatches_let_go = Counter(
            "pinlog_core_dispatches_let_go_total",
            "Refused dispatches handed to the rescan unsent: the retry set was full "
            "(overflow) or they waited most of the pending expiry (expired)",
            ["reason"],
            registry=self.registry,
        )
        self.rescan_claims = Counter(
            "pinlog_core_rescan_claims_total",
            "State rows claimed by the rescan (a retry is spent only if a worker takes one)",
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
        self.backfill_contexts = Counter(
            "pinlog_core_backfill_contexts_total",
            "Contexts of re-embedding backfill batches sent to a worker, by result (completed, "
            "cancelled, failed, not_claimed, lost, put_back, refused)",
            ["result"],
            registry=self.registry,
        )
        self.reembed_state = Gauge(
            "pinlog_core_reembed_state",
            "1 for the embedding-profile switch's state (idle, backfilling, ready, cut_over, "
            "rolling_back), 0 for the others",
            ["state"],
            registry=self.registry,
        )
        self.reembed_contexts = Gauge(
            "pinlog_core_reembed_contexts",
            "The switch's coverage of the profile being filled: live contexts (total), with "
            "its vector (done), failed, and completed ones lacking a vector of the profile in "
            "use (missing_in_use)",
            ["kind"],
            registry=self.registry,
        )
        self.embedding_vectors = Gauge(
            "pinlog_core_embedding_vectors",
            "Stored context vectors by embedding profile (visible ones)",
            ["profile"],
            registry=self.registry,
        )
        # The status of live contexts (service/status.py), refreshed by one periodic
        # statement per process, not per scrape.
        self.paused = Gauge(
            "pinlog_core_dispatch_paused",
            "1 while dispatching is paused (pinlog-core pause), else 0",
            registry=self.registry,
        )
        self.live_stages = Gauge(
            "pinlog_core_live_stages",
            "Stages of live contexts by stage and status",
            ["stage", "status"],
            registry=self.registry,
        )
        self.backlog = Gauge(
            "pinlog_core_backlog_contexts",
            "Live contexts waiting for a worker (next stage PENDING, or PROCESSING past the "
            "processing expiry), a reprocess's keyword stages not included",
            registry=self.registry,
        )
        self.reprocess_contexts = Gauge(
            "pinlog_core_reprocess_contexts",
            "Live contexts whose keyword stage a reprocess sent back, by its state (pending, "
            "processing, failed: showing the previous keywords)",
            ["state"],
            registry=self.registry,
        )
        self.lag = Gauge(
            "pinlog_core_lag_seconds",
            "Seconds the oldest PENDING or PROCESSING stage of a live context has waited (new "
            "work: a reprocess's keyword stages not included)",
            registry=self.registry,
        )
        self.coverage = Gauge(
            "pinlog_core_coverage_ratio",
            "Share of live contexts with every stage COMPLETED (1 when there are none)",
            registry=self.registry,
        )
        self.failed_24h = Gauge(
            "pinlog_core_failed_stages_24h",
            "Stages of live contexts that became FAILED in the last 24 hours, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.retry_counts = Gauge(
            "pinlog_core_live_retry_count",
            "Live contexts by retry_count",
            ["retry_count"],
            registry=self.registry,
        )
        self.provider_spend = Gauge(
            "pinlog_core_provider_spend_usd",
            "Estimated provider cost in USD of the UTC day (today) and month (month) so far, "
            "from the workers' ledger; models without a price count nothing",
            ["period"],
            registry=self.registry,
        )
        self.status_query_seconds = Histogram(
            "pinlog_core_status_query_seconds",
            "Duration of the statement behind the status gauges",
            registry=self.registry,
        )
        self.status_refreshed = Gauge(
            "pinlog_core_status_refreshed_timestamp_seconds",
            "Unix time of the last refresh of the status gauges",
            registry=self.registry,
        )
        # Read for the alert rules (deploy/prometheus/): the database as /readyz sees it
        # (set when scraped), the workers ready by the profile each serves and the profile in
        # use (the routing loop, every 5 s), and the expiry the lag is judged against.
        self.database_up = Gauge(
            "pinlog_core_database_up",
            "1 when the database answered the readiness check (within 1 s, accepting writes) "
            "at the last scrape, else 0",
            registry=self.registry,
        )
        self.workers_ready = Gauge(
            "pinlog_core_workers_ready",
            "Listed worker instances whose /readyz said ready at the last read, by the "
            "embedding profile each serves",
            ["profile"],
            registry=self.registry,
        )
        self.profile_in_use = Gauge(
            "pinlog_core_profile_in_use",
            "1 for the embedding profile in use as this process sees it (at most 5 s old)",
            ["profile"],
            registry=self.registry,
        )
        self.pending_expiry = Gauge(
            "pinlog_core_pending_expiry_seconds",
            "PINLOG_CORE_PENDING_EXPIRY_SECONDS: a PENDING stage is stale after this long",
            registry=self.registry,
        )
        self.member_quota = Counter(
            "pinlog_core_member_quota_total",
            "Member quota checks by kind (write, search, daily_notes) and outcome (admitted, "
            "limited, failed_open)",
            ["kind", "outcome"],
            registry=self.registry,
        )
