-- Least privilege for the worker's role (issue 18 item 9): column-level UPDATE instead of
-- table-level on the two tables the core shares with it, so it can change neither the owner
-- columns of a state row (user_id, record_id) nor what CONTRACT §0 reserves for the core
-- (retry_count, rescanned_at, text_sha256_from_core, context_embedding.is_deleted). A column
-- REVOKE has no effect while a table-level UPDATE stands, so the table-level one goes first.
-- The declared list is pinlog_platform/schema/worker_privileges.py; a test compares them.
-- A later migration adding a worker-written column grants its UPDATE the same way.
-- A table-level REVOKE also revokes the column grants of that privilege, so every column the
-- worker writes is granted again here, 0010's failure reasons included.
REVOKE UPDATE ON ai.context_ai_state FROM pinlog_ai_worker;
GRANT UPDATE (embedding_status, keyword_status, updated_at, embedding_attempt, keyword_attempt,
              text_sha256, seen_user_id, seen_record_id, embedding_failure, keyword_failure)
    ON ai.context_ai_state TO pinlog_ai_worker;

REVOKE UPDATE ON ai.context_embedding FROM pinlog_ai_worker;
GRANT UPDATE (user_id, record_id, embedding, embedding_profile, updated_at)
    ON ai.context_embedding TO pinlog_ai_worker;
