-- The last dispatch a worker took of a context (docs/rescan.md "Budget"), for
-- `pinlog-core inspect`: core-only columns of ai.context_ai_state like 0011's, written by the
-- core's dispatch-counting statement (no new round trip). NULL until a counted dispatch (and
-- for contexts last dispatched before this column: inspect shows "not recorded").
--   last_dispatch_at: when the core settled the dispatch (the database clock).
--   last_dispatch_worker: the worker's base URL that took it.
--   last_dispatch_outcome: 'accepted' (2xx), 'timed_out' (sent, no answer in time) or the
--     worker's verdict ('HTTP 422', 'HTTP 500', ...).
-- Refused and unreachable dispatches write nothing (they stay in the metrics only). The
-- worker's role has column-level UPDATE only (0022): it cannot write these.
ALTER TABLE ai.context_ai_state
    ADD COLUMN IF NOT EXISTS last_dispatch_at TIMESTAMPTZ NULL,
    ADD COLUMN IF NOT EXISTS last_dispatch_worker TEXT NULL,
    ADD COLUMN IF NOT EXISTS last_dispatch_outcome TEXT NULL;
