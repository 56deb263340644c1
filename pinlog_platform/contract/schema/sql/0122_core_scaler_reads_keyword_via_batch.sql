-- The autoscaler's role (0106) reads the column its query now filters on (0121: keyword
-- stages a provider batch judges are not a worker's work). A core migration: the role is the
-- core's.
GRANT SELECT (keyword_via_batch) ON ai.context_ai_state TO pinlog_scaler;
