"""Limits: how long, how often and how much (§2, §6, §8).

Provider calls (batching, timeout, retries, breaker), the stages (PROCESSING expiry, input
length, candidates), the worker (concurrency, queue, shutdown grace), its connections and
request bodies. One provider call with its retries must end before the expiry (§2, §10 #9).
"""

from __future__ import annotations

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from pinlog_platform.contract.request_limits import MAX_REQUEST_BYTES, MIN_REQUEST_BYTES

# Search's own pool (app/composition.py), so stage work never queues it.
SEARCH_CONNECTIONS = 2
# The SQLAlchemy pool of the preset cache and startup checks (app/composition.py); stage
# statements have a pool of their own.
SUPPORT_CONNECTIONS = 2
# A worker task holds a connection for one statement at a time and never across a provider
# call, so past this many tasks more connections only add idle backends (and can exceed the
# server's max_connections): the default pool stops growing here.
STAGE_CONNECTIONS_CAP = 30


class LimitSettings(BaseModel):
    """Durations are seconds. Validated after the provider and profile settings."""

    embedding_batch_size: int = Field(
        default=16, ge=1, le=2048, description="Embedding stages sent in one provider request"
    )
    embedding_batch_wait_ms: float = Field(
        default=10.0,
        ge=0,
        le=1000,
        description="How long a batch's first embedding stage waits for company",
    )

    provider_timeout_seconds: float = Field(
        default=30.0, gt=0, description="Per attempt of one provider call"
    )
    provider_max_retries: int = Field(
        default=2, ge=0, le=5, description="Short retries inside one call (§6); x timeout < expiry"
    )

    embedding_requests_per_minute: int = Field(
        default=0,
        ge=0,
        description=(
            "Embedding requests on the wire per minute, retries included, all replicas "
            "(0: no limit)"
        ),
    )
    embedding_tokens_per_minute: int = Field(
        default=0,
        ge=0,
        description="Embedding tokens per minute, all replicas (0: no limit); also splits "
        "embedding batches",
    )
    judge_requests_per_minute: int = Field(
        default=0,
        ge=0,
        description=(
            "Judge requests on the wire per minute, retries included, all replicas (0: no limit)"
        ),
    )
    judge_tokens_per_minute: int = Field(
        default=0,
        ge=0,
        description="Judge tokens (prompt + completion) per minute, all replicas (0: no limit)",
    )
    worker_replicas: int = Field(
        default=1,
        ge=1,
        description="Worker processes sharing the per-minute budgets: each takes its share",
    )
    rate_budget_window_seconds: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="The window of the *_PER_MINUTE budgets in seconds (60; shorter in tests)",
    )

    breaker_threshold: int = Field(
        default=5,
        ge=1,
        description="Consecutive provider-wide faults that make a provider unavailable",
    )
    breaker_cooldown_seconds: float = Field(
        default=60.0,
        ge=0,
        description="Seconds between the worker's own probes of an unavailable provider",
    )
    refuse_while_provider_unavailable: bool = Field(
        default=True,
        description=(
            "Answer process requests 503 + Retry-After while a provider is unavailable; turn "
            "off only for a core that spends a retry per refused dispatch"
        ),
    )

    embedding_max_input_chars: int = Field(
        default=6000, ge=1, description="Longer normalised text is a permanent input error"
    )
    processing_expiry_seconds: int = Field(
        default=600,
        ge=1,
        le=10 * 365 * 24 * 3600,  # an interval PostgreSQL holds (core: MAX_SQL_SECONDS)
        description="A PROCESSING stage older than this may be reclaimed (§2)",
    )
    keyword_top_k: int = Field(default=10, ge=1, le=100, description="Candidates per judgment")
    presets_refresh_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="How often the preset cache is reloaded in the background (a new list is "
        "picked up without a restart; /readyz presetVersion reports the loaded one)",
    )
    keyword_similarity_floor: float = Field(
        default=0.2, ge=-1.0, le=1.0, description="Minimum cosine of a candidate (§4)"
    )

    search_similarity_floor: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="Internal search: hits below this cosine are dropped; 0 = off (§7's set)",
    )
    search_similarity_floor_word: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="Internal search: the floor for a one-word query of <= 5 characters; 0 = off",
    )
    search_top_ratio: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="Internal search: hits below this share of the best hit's cosine are "
        "dropped; 0 = off",
    )
    search_keyword_match_threshold: float = Field(
        default=0.30,
        ge=-1.0,
        le=1.0,
        description="keywordMatched: a visible keyword's preset cosine to the query above this "
        "(§7; PINLOG_OFFLINE: 0.25, chosen for the fused search, docs/search.md)",
    )
    search_keyword_match_top: int = Field(
        default=0,
        ge=0,
        le=1000,
        description="keywordMatched: only the presets among this many closest to the query "
        "(above the threshold) match; 0 = every preset above it (§7; PINLOG_OFFLINE: 0, "
        "docs/search.md)",
    )

    worker_concurrency: int = Field(
        default=4, ge=1, le=256, description="Contexts processed at once by one process"
    )
    queue_capacity: int = Field(
        default=1000, ge=1, description="Accepted requests waiting; beyond it 503 + Retry-After"
    )
    shutdown_grace_seconds: float = Field(
        default=10.0, ge=0, description="Running work's time to finish on SIGTERM"
    )
    database_pool_size: int | None = Field(
        default=None,
        ge=1,
        description="Default: min(WORKER_CONCURRENCY, STAGE_CONNECTIONS_CAP) + SEARCH_CONNECTIONS",
    )
    max_request_bytes: int = Field(
        default=65536,
        ge=MIN_REQUEST_BYTES,
        le=MAX_REQUEST_BYTES,
        description="Larger bodies answer 413",
    )

    @field_validator("processing_expiry_seconds")
    @classmethod
    def _call_fits_expiry(cls, value: int, info: ValidationInfo) -> int:
        timeout = info.data.get("provider_timeout_seconds")
        retries = info.data.get("provider_max_retries")
        if timeout is None or retries is None:
            return value
        longest_call = timeout * (retries + 1)
        if longest_call >= value:
            # A call that outlives the expiry lets a duplicate request reclaim a live stage.
            raise ValueError(
                f"PINLOG_PROVIDER_TIMEOUT_SECONDS x (PINLOG_PROVIDER_MAX_RETRIES + 1) = "
                f"{longest_call:g} s must stay below PINLOG_PROCESSING_EXPIRY_SECONDS "
                f"({value} s)"
            )
        return value

    @property
    def pool_size_needed(self) -> int:
        """Stage connections the worker can use at once: one per worker task (at most
        ``STAGE_CONNECTIONS_CAP``) plus ``SEARCH_CONNECTIONS`` spare."""
        return min(self.worker_concurrency, STAGE_CONNECTIONS_CAP) + SEARCH_CONNECTIONS

    @property
    def pool_size(self) -> int:
        """``DATABASE_POOL_SIZE`` when set, else ``pool_size_needed``."""
        return self.database_pool_size or self.pool_size_needed
