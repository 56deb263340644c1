-- A keyword reprocess through the provider's Batch API (`pinlog-core reprocess keywords --via
-- batch`; docs/operations.md "Reprocess via the Batch API"; docs/contract.md §2 and §9,
-- Deviation "batch-held work").
--
-- The core writes keyword_via_batch with its reset and clears keyword_batch_id (its
-- table-level UPDATE on ai.context_ai_state, 0023, covers both): no core grant is needed.
-- ai.context_ai_state.keyword_via_batch: the reprocess marked this keyword stage for the
--   Batch API (only the rows that reprocess reset; rows reset or created later go sync). The
--   worker clears it when a batch returns the stage unfinished (expired, failed, cancelled, a
--   provider-wide item error, an invalid judgment): it goes back to the synchronous path.
-- ai.context_ai_state.keyword_batch_id: the provider batch holding the keyword stage
--   (worker-written, with the claim's attempt). A PROCESSING keyword stage with a batch id
--   is batch-held: neither the worker's reclaim after the processing expiry, nor the rescan,
--   nor the finalizer touches it.
ALTER TABLE ai.context_ai_state
    ADD COLUMN IF NOT EXISTS keyword_via_batch BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE ai.context_ai_state
    ADD COLUMN IF NOT EXISTS keyword_batch_id VARCHAR(100) NULL;
GRANT UPDATE (keyword_via_batch, keyword_batch_id) ON ai.context_ai_state TO pinlog_ai_worker;
-- The marked stages the core still has to send (a partial index: empty but during such a
-- reprocess).
CREATE INDEX IF NOT EXISTS context_ai_state_keyword_via_batch_idx
    ON ai.context_ai_state (context_id) WHERE keyword_via_batch;

-- A provider batch is of embeddings (a backfill) or of keyword judgments (a reprocess).
ALTER TABLE ai.provider_batch DROP CONSTRAINT IF EXISTS provider_batch_kind_check;
ALTER TABLE ai.provider_batch
    ADD CONSTRAINT provider_batch_kind_check CHECK (kind IN ('embed', 'keyword'));
CREATE INDEX IF NOT EXISTS provider_batch_open_kind_idx
    ON ai.provider_batch (kind, embedding_profile, updated_at) WHERE NOT settled;

-- What a judgment's save needs beyond the answer: the candidates the judge was asked to
-- choose among (keyword id and cosine, best first), the preset list and profile they came
-- from, and the attempt that claimed the stage. Written with the batch, deleted when it is
-- settled; any worker of the profile (a restarted one too) settles it from here.
CREATE TABLE IF NOT EXISTS ai.keyword_batch_item (
    batch_id          VARCHAR(100) NOT NULL REFERENCES ai.provider_batch (batch_id)
                                   ON DELETE CASCADE,
    context_id        BIGINT       NOT NULL,
    attempt           INT          NOT NULL,
    preset_version    INT          NOT NULL,
    embedding_profile VARCHAR(100) NOT NULL,
    candidates        JSONB        NOT NULL,
    PRIMARY KEY (batch_id, context_id)
);
GRANT SELECT, INSERT, DELETE ON ai.keyword_batch_item TO pinlog_ai_worker;
