-- The autoscaler's count of a profile's live work leaves out the keyword stages a keyword
-- reprocess marked for the provider's Batch API (0120: keyword_via_batch; the provider judges
-- them, not a worker, for up to 24 hours: docs/scaling.md "Autoscaling on the backlog"). This
-- partial index holds exactly the rows it counts, so the count stays an index-only scan
-- (pinlog_platform/contract/scaler.py); it replaces context_ai_state_work_idx (0105), which
-- nothing else reads. Cost: one scan of ai.context_ai_state to build it, under its lock.
CREATE INDEX IF NOT EXISTS context_ai_state_unbatched_work_idx
    ON ai.context_ai_state (context_id)
    WHERE embedding_status IN ('PENDING', 'PROCESSING')
       OR (embedding_status = 'COMPLETED' AND keyword_status IN ('PENDING', 'PROCESSING')
           AND NOT keyword_via_batch);
DROP INDEX IF EXISTS ai.context_ai_state_work_idx;
