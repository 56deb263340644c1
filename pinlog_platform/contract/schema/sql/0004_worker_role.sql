-- The worker's database role: privileges on schema ai only (CONTRACT §8). NOLOGIN: the
-- operator grants it to a login role (GRANT pinlog_ai_worker TO <login>).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pinlog_ai_worker') THEN
        CREATE ROLE pinlog_ai_worker NOLOGIN;
    END IF;
END
$$;

REVOKE ALL ON SCHEMA core FROM pinlog_ai_worker;
GRANT USAGE ON SCHEMA ai TO pinlog_ai_worker;
GRANT SELECT, INSERT, UPDATE ON ai.keyword_preset TO pinlog_ai_worker;  -- presets load
GRANT SELECT, UPDATE ON ai.context_ai_state TO pinlog_ai_worker;
GRANT SELECT, INSERT, UPDATE ON ai.context_embedding TO pinlog_ai_worker;
GRANT SELECT, INSERT, DELETE ON ai.context_keyword TO pinlog_ai_worker;
GRANT SELECT, INSERT, UPDATE ON ai.context_keyword_analysis TO pinlog_ai_worker;
GRANT SELECT, INSERT, UPDATE ON ai.context_text_fingerprint TO pinlog_ai_worker;
