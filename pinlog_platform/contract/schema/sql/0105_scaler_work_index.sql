-- The autoscaler's count of a profile's waiting work (pinlog_platform/contract/scaler.py,
-- docs/scaling.md "Autoscaling on the backlog"): a state row is work while the stage that runs
-- next is PENDING or PROCESSING (the next stage of NEXT_STAGE_SQL in the core's repository).
-- This partial index holds exactly those rows, so the scaler's count reads the index alone
-- (an index-only scan; the visibility map decides the heap fetches) and never the finished
-- history. Its key is the narrowest column there is; the statuses are in the predicate.
-- Cost: every state row enters it once when created and leaves it when its last stage ends;
-- status changes are never HOT updates anyway (context_ai_state_embedding_idx and
-- context_ai_state_keyword_idx index the statuses).
CREATE INDEX IF NOT EXISTS context_ai_state_work_idx
    ON ai.context_ai_state (context_id)
    WHERE embedding_status IN ('PENDING', 'PROCESSING')
       OR (embedding_status = 'COMPLETED' AND keyword_status IN ('PENDING', 'PROCESSING'));
