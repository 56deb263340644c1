-- The autoscaler's count of a profile's open backfill rows leaves out the rows a provider
-- batch holds (0115: a batch id set; the provider works on them, not a worker: docs/scaling.md
-- "Autoscaling on the backlog"). This partial index holds exactly the rows it counts, so the
-- count stays an index-only scan (pinlog_platform/contract/scaler.py). It replaces, for that
-- count, context_embedding_backfill_open_idx (0060), which the core's next batch still reads.
-- Cost: one scan of ai.context_embedding_backfill (empty but during a profile switch).
CREATE INDEX IF NOT EXISTS context_embedding_backfill_unheld_idx
    ON ai.context_embedding_backfill (embedding_profile, context_id)
    WHERE status IN ('PENDING', 'PROCESSING') AND batch_id IS NULL;
