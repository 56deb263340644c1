-- The autoscaler's role (0106) reads the column its query now filters on (0117: rows a
-- provider batch holds are not a worker's work). A core migration: the role is the core's.
GRANT SELECT (batch_id) ON ai.context_embedding_backfill TO pinlog_scaler;
