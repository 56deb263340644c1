-- Fencing tokens for the worker's stages (docs/state-machine.md, "Attempts"; a deliberate
-- addition to the contract's §2). Every claim of a stage increments its counter and keeps
-- the new value; the save and the permanent-failure transition require the counter to still
-- equal it. An attempt that stalled past the expiry while another request reclaimed the
-- stage therefore can never store or fail anything. Only the worker's claims write these
-- columns; the core side never does (its rescan writes retry_count and rescanned_at only).
ALTER TABLE ai.context_ai_state
    ADD COLUMN IF NOT EXISTS embedding_attempt INT NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS keyword_attempt   INT NOT NULL DEFAULT 0;
