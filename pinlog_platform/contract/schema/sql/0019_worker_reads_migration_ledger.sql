-- The worker's role may read the migrations ledger, so that `pinlog-ai db upgrade` run as that
-- role (compose's `pinlog_ai`) finds nothing pending and exits 0 without any DDL; it still
-- cannot record or apply anything (it names the missing privilege instead).
GRANT SELECT ON ai.stub_migration TO pinlog_ai_worker;
