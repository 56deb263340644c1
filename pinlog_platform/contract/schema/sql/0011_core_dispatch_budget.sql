-- The retry budget pays only for dispatches a worker took (docs/contract.md §9 Deviation,
-- docs/rescan.md "Budget"). A core-only column of ai.context_ai_state, like those of 0006:
--   dispatch_accepted_at: when a worker first took this context (202, or a timeout after the
--     request was sent). NULL until then, so the first accepted dispatch of a context, whichever
--     path sent it, is free; every later accepted re-request spends one retry_count.
-- A refused dispatch (503, connection refused) writes nothing.
ALTER TABLE ai.context_ai_state
    ADD COLUMN IF NOT EXISTS dispatch_accepted_at TIMESTAMPTZ NULL;
