-- When the rescan may take a row before its expiry (docs/rescan.md "Backlog"). A core-only
-- column of ai.context_ai_state, like those of 0006 and 0011:
--   next_dispatch_at: set when the dispatcher of a core process cannot keep a refused
--     dispatch in memory (its retry set is full) or lets it go (it waited a whole pending
--     expiry): the rescan's claim takes the row from then on, and clears the column. NULL
--     otherwise. Eligible for the rescan = the expiry rule OR next_dispatch_at <= now().
ALTER TABLE ai.context_ai_state
    ADD COLUMN IF NOT EXISTS next_dispatch_at TIMESTAMPTZ NULL;

-- Few rows carry it at any time: a partial index keeps the claim's lookup of due rows cheap.
CREATE INDEX IF NOT EXISTS context_ai_state_next_dispatch_idx
    ON ai.context_ai_state (next_dispatch_at)
    WHERE next_dispatch_at IS NOT NULL;
