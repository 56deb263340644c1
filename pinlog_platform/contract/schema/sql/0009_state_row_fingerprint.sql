-- What the first claiming request said about its context, kept on the state row so that the
-- statement that starts a context (pre-check, owner check, embedding claim: one UPDATE) records
-- it at no extra write (docs/contract.md §3; it replaces ai.context_text_fingerprint, whose
-- rows are copied here and which the worker no longer writes).
--   text_sha256: SHA-256 of the request's normalised text (a digest, never the text).
--   seen_user_id, seen_record_id: the first claiming request's owner. They are the reference
--     only while the core-written user_id/record_id (0006) are NULL, i.e. for rows written by a
--     core side that follows the original contract.
-- Worker-written columns; the core side never writes them.
ALTER TABLE ai.context_ai_state
    ADD COLUMN IF NOT EXISTS text_sha256    BYTEA  NULL
        CHECK (text_sha256 IS NULL OR octet_length(text_sha256) = 32),
    ADD COLUMN IF NOT EXISTS seen_user_id   BIGINT NULL,
    ADD COLUMN IF NOT EXISTS seen_record_id BIGINT NULL;

UPDATE ai.context_ai_state AS s
SET text_sha256 = f.text_sha256, seen_user_id = f.user_id, seen_record_id = f.record_id
FROM ai.context_text_fingerprint AS f
WHERE f.context_id = s.context_id AND s.text_sha256 IS NULL;
