-- The core's role may read the provider usage ledger (0030), so that `pinlog-core status` and
-- the core's gauges show today's and this month's provider spend. It reads only: the workers
-- write the ledger.
GRANT SELECT ON ai.provider_usage_daily TO pinlog_core_service;
