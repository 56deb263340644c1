-- How `reembed start` asked the backfill rows it proposed to be sent (docs/operations.md
-- "Backfill via the Batch API"): sync (the workers embed them at once) or batch (they submit
-- them to the provider's Batch API). Every core process reads it, so all send the same way.
ALTER TABLE core.embedding_switch
    ADD COLUMN IF NOT EXISTS via VARCHAR(10) NOT NULL DEFAULT 'sync'
        CHECK (via IN ('sync', 'batch'));

-- The core counts the provider batches (`status`, `reembed status`) and asks the workers to
-- cancel an abandoned profile's open ones (`reembed rollback` / `finish`); it never calls a
-- provider (§0).
GRANT SELECT, UPDATE (cancel_requested) ON ai.provider_batch TO pinlog_core_service;
