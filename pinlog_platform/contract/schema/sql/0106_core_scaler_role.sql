-- The autoscaler's database role (KEDA's PostgreSQL trigger, docs/scaling.md "Autoscaling on
-- the backlog"): it may read exactly the columns the scaler's query reads
-- (pinlog_platform/contract/scaler.py) and nothing else: no note text, no owner, no vector.
-- NOLOGIN: the operator grants it to a login role (GRANT pinlog_scaler TO <login>).
-- A core migration (`pinlog-core db upgrade`): it grants on core.embedding_switch, which a
-- worker-only upgrade (`pinlog-ai db upgrade`) does not create.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pinlog_scaler') THEN
        CREATE ROLE pinlog_scaler NOLOGIN;
    END IF;
END
$$;

GRANT USAGE ON SCHEMA ai, core TO pinlog_scaler;
GRANT SELECT (embedding_status, keyword_status) ON ai.context_ai_state TO pinlog_scaler;
GRANT SELECT (embedding_profile, status) ON ai.context_embedding_backfill TO pinlog_scaler;
GRANT SELECT (profile_in_use) ON core.embedding_switch TO pinlog_scaler;
