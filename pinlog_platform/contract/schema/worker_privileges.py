"""The one declared list of what the worker's role ``pinlog_ai_worker`` may do.

Table-level privileges by table of schema ``ai``, and the columns it may ``INSERT`` or ``UPDATE``
where it has no table-level privilege of that kind: it can change neither the owner columns of
a state row (``user_id``, ``record_id``) nor what §0 reserves for the core (``retry_count``,
``rescanned_at``, ``text_sha256_from_core``, ``keyword_reprocess_version``,
``context_embedding.is_deleted``), nor the preset columns frozen by
``0050_keyword_preset_embedding.sql`` (``keyword_preset.embedding``, ``embedding_profile``).
``0004_worker_role.sql``, ``0022_worker_column_grants.sql``, ``0050``, ``0060``, ``0115`` and
``0120`` grant exactly this;
``tests/platform/test_worker_privileges.py`` compares the database with it. A later migration
that adds a worker-written column grants it there and adds it here. No schema ``core``
privilege at all (§0).
"""

from __future__ import annotations

WORKER_ROLE = "pinlog_ai_worker"

TABLE_PRIVILEGES: dict[str, frozenset[str]] = {
    # presets load writes the shared columns (COLUMN_INSERTS, COLUMN_UPDATES) and the vectors
    # of its own profile (0050).
    "keyword_preset": frozenset({"SELECT"}),
    "keyword_preset_embedding": frozenset({"SELECT", "INSERT"}),
    "context_ai_state": frozenset({"SELECT"}),
    "context_embedding": frozenset({"SELECT", "INSERT"}),
    "context_keyword": frozenset({"SELECT", "INSERT", "DELETE"}),
    "context_keyword_analysis": frozenset({"SELECT", "INSERT", "UPDATE"}),
    "context_text_fingerprint": frozenset({"SELECT", "INSERT", "UPDATE"}),
    # The migration ledger, read by the worker's startup check (0019).
    "stub_migration": frozenset({"SELECT"}),
    # The provider usage ledger the worker keeps (0030).
    "provider_usage_daily": frozenset({"SELECT", "INSERT", "UPDATE"}),
    # The re-embedding backfill: the worker claims and settles rows the core proposed (0060).
    "context_embedding_backfill": frozenset({"SELECT"}),
    # The provider batches a worker submitted (0115): any worker of the profile polls them.
    "provider_batch": frozenset({"SELECT", "INSERT"}),
    # What a keyword batch's save needs beyond the answer, deleted once settled (0120).
    "keyword_batch_item": frozenset({"SELECT", "INSERT", "DELETE"}),
}

COLUMN_UPDATES: dict[str, frozenset[str]] = {
    # §2 transitions, the attempt counters (0008), the first request's facts (0009) and the
    # reason of a FAILED stage (0010).
    "context_ai_state": frozenset(
        {
            "embedding_status",
            "keyword_status",
            "updated_at",
            "embedding_attempt",
            "keyword_attempt",
            "text_sha256",
            "seen_user_id",
            "seen_record_id",
            "embedding_failure",
            "keyword_failure",
            # A keyword stage held in a provider batch, and its return to the synchronous
            # path (0120).
            "keyword_via_batch",
            "keyword_batch_id",
        }
    ),
    # The UPSERT of a vector (never is_deleted, §0).
    "context_embedding": frozenset(
        {"user_id", "record_id", "embedding", "embedding_profile", "updated_at"}
    ),
    # presets load: every shared column but the key and the immutable code (§4), never the
    # frozen vector columns (0050).
    "keyword_preset": frozenset(
        {
            "display_name",
            "category",
            "description",
            "examples",
            "visibility",
            "is_active",
            "version",
        }
    ),
    # presets load: a profile's vector of a preset, re-embedded (0050).
    "keyword_preset_embedding": frozenset({"embedding", "preset_version", "updated_at"}),
    # The backfill's claim and settlement (0060); never requested_at, the core's.
    # The backfill's claim and settlement (0060); never requested_at, the core's. The batch
    # holding a row, and the row's return to the synchronous path (0115).
    "context_embedding_backfill": frozenset(
        {"status", "attempt", "failure_reason", "updated_at", "via_batch", "batch_id"}
    ),
    # A batch's progress as polled, its results' settlement and the poller's lease (0115);
    # never cancel_requested, the core's.
    "provider_batch": frozenset(
        {
            "status",
            "output_file_id",
            "error_file_id",
            "settled_tokens",
            "settled",
            "lease_until",
            "updated_at",
        }
    ),
}

COLUMN_INSERTS: dict[str, frozenset[str]] = {
    # presets load inserts a new preset's shared columns only (0050).
    "keyword_preset": frozenset(
        {
            "id",
            "code",
            "display_name",
            "category",
            "description",
            "examples",
            "visibility",
            "is_active",
            "version",
        }
    ),
}
