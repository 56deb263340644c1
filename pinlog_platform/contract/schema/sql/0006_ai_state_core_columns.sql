-- Columns of ai.context_ai_state that only the core service writes (docs/contract.md §9, the
-- deliberate deviations in docs/rescan.md).
--   rescanned_at: set by the rescan's claim. Staleness stays "updated_at older than the expiry"
--     (the worker's progress clock, §2); the rescan never writes updated_at, and a row it has
--     just re-requested is not picked again until rescanned_at is older than the expiry too.
--   user_id, record_id: the context's owner and record as the core side knows them at create
--     time, so the worker can check a request against the source of truth without core.*.
--     NULL for rows written by a core side that follows the original contract.
ALTER TABLE ai.context_ai_state
    ADD COLUMN IF NOT EXISTS rescanned_at TIMESTAMPTZ NULL,
    ADD COLUMN IF NOT EXISTS user_id      BIGINT      NULL,
    ADD COLUMN IF NOT EXISTS record_id    BIGINT      NULL;

-- The rescan and the finalizer look only at unfinished rows, a small share of the table.
CREATE INDEX IF NOT EXISTS context_ai_state_unfinished_idx
    ON ai.context_ai_state (updated_at)
    WHERE embedding_status IN ('PENDING', 'PROCESSING')
       OR keyword_status IN ('PENDING', 'PROCESSING');
