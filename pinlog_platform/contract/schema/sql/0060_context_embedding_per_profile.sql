-- Context vectors per embedding profile (docs/contract.md §1, Deviation "vectors per
-- profile"): while the profile is switched side by side (`pinlog-core reembed`,
-- docs/operations.md) a context has one vector under the profile in use and one under the
-- other profile, so the key of ai.context_embedding becomes (context_id, embedding_profile).
-- The embedding column declares no dimension any more: each profile's vectors have the one
-- dimension its worker stores (PINLOG_VECTOR_DIMENSION: today's zero-padded 512-d offline
-- vectors stay as they are, 1536-d, and keep their cosine).
--
-- Cost (measured on 100,000 rows, docs/operations.md "Migration 0060"): dropping the
-- declared dimension changes only the type modifier (no rewrite, no scan); the new primary
-- key builds one unique index (one scan and sort) under the table's exclusive lock.
ALTER TABLE ai.context_embedding DROP CONSTRAINT IF EXISTS context_embedding_pkey;
ALTER TABLE ai.context_embedding ADD PRIMARY KEY (context_id, embedding_profile);
ALTER TABLE ai.context_embedding ALTER COLUMN embedding TYPE vector;

-- Which profile's preset vectors a judgment chose among (written by the keyword save): a
-- cutover re-judges every judgment of another profile. NULL: judged before this column
-- existed, under the profile then in use (`reembed start` stamps it before a switch).
-- A nullable column without a default rewrites nothing.
ALTER TABLE ai.context_keyword_analysis
    ADD COLUMN IF NOT EXISTS embedding_profile VARCHAR(100) NULL;

-- The backfill's own per-context state under one profile, beside the live stages' columns
-- (which it never touches). The core proposes rows (status PENDING, requested_at); the worker
-- claims one with a conditional UPDATE (PENDING, or PROCESSING older than the processing
-- expiry: a reclaim), attempt + 1 as its fencing token, and saves the vector in one statement
-- that locks the context's state row first (docs/lock-order.md) and re-checks it: a
-- CANCELLED live state wins (the row ends CANCELLED, no vector is written).
--   failure_reason: why a row is FAILED (the note's own fault, e.g. rejected by the provider).
--   requested_at: when a core process last sent the row to a worker (core-only).
CREATE TABLE IF NOT EXISTS ai.context_embedding_backfill (
    embedding_profile VARCHAR(100) NOT NULL,
    context_id        BIGINT       NOT NULL,
    status            VARCHAR(20)  NOT NULL DEFAULT 'PENDING'
        CHECK (status IN ('PENDING', 'PROCESSING', 'COMPLETED', 'FAILED', 'CANCELLED')),
    attempt           INT          NOT NULL DEFAULT 0,
    failure_reason    VARCHAR(40)  NULL,
    requested_at      TIMESTAMPTZ  NULL,
    updated_at        TIMESTAMPTZ  NOT NULL DEFAULT now(),
    PRIMARY KEY (embedding_profile, context_id)
);

-- The worker claims and settles rows (status, attempt, failure_reason, updated_at) and
-- never proposes or removes one (pinlog_platform/schema/worker_privileges.py).
GRANT SELECT ON ai.context_embedding_backfill TO pinlog_ai_worker;
GRANT UPDATE (status, attempt, failure_reason, updated_at)
    ON ai.context_embedding_backfill TO pinlog_ai_worker;

-- The core's next batch: the open rows of a profile in id order, without walking the done ones.
CREATE INDEX IF NOT EXISTS context_embedding_backfill_open_idx
    ON ai.context_embedding_backfill (embedding_profile, context_id)
    WHERE status IN ('PENDING', 'PROCESSING');
