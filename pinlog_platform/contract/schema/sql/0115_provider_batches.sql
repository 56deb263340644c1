-- Bulk work through the provider's Batch API (docs/operations.md "Backfill via the Batch API";
-- docs/contract.md §2 and §9, Deviation "batch-held work").
--
-- The core's half (how the switch sends, its role's grants on the new table) is
-- 0116_core_embedding_switch_via.sql.
-- ai.context_embedding_backfill.via_batch: the core marked this row for the Batch API (only
--   the rows `reembed start` proposed; rows proposed later go sync). The worker clears it when
--   a batch returns the row unfinished (expired, failed, cancelled, a provider-wide item
--   error): the row goes back to the synchronous path.
-- ai.context_embedding_backfill.batch_id: the provider batch holding the row (worker-written,
--   set with the claim's attempt). A PROCESSING row with a batch id is batch-held: neither
--   the worker's reclaim after the processing expiry nor the core's resend touches it.
ALTER TABLE ai.context_embedding_backfill
    ADD COLUMN IF NOT EXISTS via_batch BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE ai.context_embedding_backfill
    ADD COLUMN IF NOT EXISTS batch_id VARCHAR(100) NULL;
GRANT UPDATE (via_batch, batch_id) ON ai.context_embedding_backfill TO pinlog_ai_worker;

-- One provider batch a worker submitted, so that any worker of the profile (a restarted one
-- too) polls it, reads its output and error files and saves its results.
--   status: the provider's (validating, in_progress, finalizing, completed, failed, expired,
--     cancelling, cancelled), as last polled.
--   settled: its results were saved and its unfinished rows returned (nothing more to do).
--   cancel_requested: written by the core (`reembed rollback` / `finish`): the profile was
--     abandoned; a worker cancels the batch and discards what it returns.
--   lease_until: a worker polling it; another skips it until then.
--   estimated_tokens / settled_tokens: counted against the daily cap at submission, settled
--     from the results' usage.
CREATE TABLE IF NOT EXISTS ai.provider_batch (
    batch_id          VARCHAR(100) PRIMARY KEY,
    kind              VARCHAR(20)  NOT NULL CHECK (kind IN ('embed')),
    embedding_profile VARCHAR(100) NOT NULL,
    status            VARCHAR(20)  NOT NULL,
    items             INT          NOT NULL CHECK (items >= 0),
    input_file_id     VARCHAR(100) NOT NULL,
    output_file_id    VARCHAR(100) NULL,
    error_file_id     VARCHAR(100) NULL,
    estimated_tokens  BIGINT       NOT NULL DEFAULT 0,
    settled_tokens    BIGINT       NULL,
    settled           BOOLEAN      NOT NULL DEFAULT false,
    cancel_requested  BOOLEAN      NOT NULL DEFAULT false,
    lease_until       TIMESTAMPTZ  NULL,
    submitted_at      TIMESTAMPTZ  NOT NULL DEFAULT now(),
    updated_at        TIMESTAMPTZ  NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS provider_batch_open_idx
    ON ai.provider_batch (embedding_profile, updated_at) WHERE NOT settled;
GRANT SELECT, INSERT ON ai.provider_batch TO pinlog_ai_worker;
GRANT UPDATE (status, output_file_id, error_file_id, settled_tokens, settled, lease_until,
              updated_at) ON ai.provider_batch TO pinlog_ai_worker;
