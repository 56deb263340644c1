-- The core service's database role (issue 18 item 9): it runs as a login role that is a
-- member of pinlog_core_service, never as the owner or a superuser; only the migration runs
-- as the owner. NOLOGIN: the operator grants it to a login role (deploy/postgres-init creates
-- pinlog_core for compose). The core owns core.* (reads and writes, never DDL, never DELETE:
-- deletion is soft) and writes on ai.* exactly what CONTRACT §0 gives it.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'pinlog_core_service') THEN
        CREATE ROLE pinlog_core_service NOLOGIN;
    END IF;
END
$$;

GRANT USAGE ON SCHEMA core, ai TO pinlog_core_service;
GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA core TO pinlog_core_service;
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA core TO pinlog_core_service;
-- Tables and sequences later migrations create in core (run by the owner) get the same.
ALTER DEFAULT PRIVILEGES IN SCHEMA core
    GRANT SELECT, INSERT, UPDATE ON TABLES TO pinlog_core_service;
ALTER DEFAULT PRIVILEGES IN SCHEMA core
    GRANT USAGE, SELECT ON SEQUENCES TO pinlog_core_service;

-- §0: creates state rows, cancels, spends retry_count, finalizes, operational resets.
GRANT SELECT, INSERT, UPDATE ON ai.context_ai_state TO pinlog_core_service;
-- §0: only is_deleted (and the updated_at that goes with every change).
GRANT SELECT ON ai.context_embedding TO pinlog_core_service;
GRANT UPDATE (is_deleted, updated_at) ON ai.context_embedding TO pinlog_core_service;
-- Keyword reads (§9) and the schema ledger (readiness of the schema).
GRANT SELECT ON ai.context_keyword, ai.keyword_preset, ai.context_keyword_analysis
    TO pinlog_core_service;
DO $$
BEGIN
    IF to_regclass('ai.stub_migration') IS NOT NULL THEN
        GRANT SELECT ON ai.stub_migration TO pinlog_core_service;
    END IF;
END
$$;
