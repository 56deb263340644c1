-- The rescan's claim takes due rows round robin over owners, oldest first within an owner
-- (docs/scaling.md "Fairness"): it numbers each owner's unfinished rows by age. This index
-- hands them over already in (owner, age) order, so numbering them needs no sort, and, like
-- context_ai_state_unfinished_idx (0006), it holds only unfinished rows, a small share of the
-- table however long its finished history grows.
CREATE INDEX IF NOT EXISTS context_ai_state_owner_unfinished_idx
    ON ai.context_ai_state (user_id, updated_at, context_id)
    WHERE embedding_status IN ('PENDING', 'PROCESSING')
       OR keyword_status IN ('PENDING', 'PROCESSING');
