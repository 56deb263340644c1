-- The core writes the digest of the text it committed (pinlog_platform/text_fingerprint.py) in
-- the statement that inserts the PENDING state row, and says so in text_sha256_from_core. The
-- worker then refuses a process request whose text does not match it: the core is the source
-- of truth (docs/contract.md §3, scenario 5, Deviation). Rows written before this migration,
-- or by a core side that follows the original contract, keep false and the first-request rule
-- (0009): the first claiming request's digest is the reference and a mismatch is only counted.
-- Core-written column; the worker never writes it (0022 grants it no UPDATE on it).
ALTER TABLE ai.context_ai_state
    ADD COLUMN IF NOT EXISTS text_sha256_from_core BOOLEAN NOT NULL DEFAULT false;

ALTER TABLE ai.context_ai_state
    DROP CONSTRAINT IF EXISTS context_ai_state_core_digest_present;
ALTER TABLE ai.context_ai_state
    ADD CONSTRAINT context_ai_state_core_digest_present
        CHECK (NOT text_sha256_from_core OR text_sha256 IS NOT NULL);
