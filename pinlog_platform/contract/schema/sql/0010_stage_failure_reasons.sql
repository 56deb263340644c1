-- Why a stage is FAILED (issue H2 item 4): one reason code per stage, written in the same
-- statement that writes the stage's FAILED (the worker's fail transitions, the core's
-- finalizer and its closing of keyword stages whose embedding FAILED). A closed set of codes
-- (pinlog_platform/states/failure_reasons.py), never user text or a provider's message.
-- Rows FAILED before this migration read as 'unknown'. A column keeps its value when the
-- stage later moves on (FAILED -> CANCELLED); readers look at it only while FAILED.
ALTER TABLE ai.context_ai_state
    ADD COLUMN IF NOT EXISTS embedding_failure VARCHAR(30) NULL
        CONSTRAINT context_ai_state_embedding_failure_check CHECK (embedding_failure IN (
            'input_too_long', 'input_blank', 'input_rejected', 'dimension_mismatch',
            'judge_output_invalid', 'judge_refused', 'judge_truncated', 'profile_mismatch',
            'embedding_failed', 'retries_exhausted', 'unknown')),
    ADD COLUMN IF NOT EXISTS keyword_failure VARCHAR(30) NULL
        CONSTRAINT context_ai_state_keyword_failure_check CHECK (keyword_failure IN (
            'input_too_long', 'input_blank', 'input_rejected', 'dimension_mismatch',
            'judge_output_invalid', 'judge_refused', 'judge_truncated', 'profile_mismatch',
            'embedding_failed', 'retries_exhausted', 'unknown'));

UPDATE ai.context_ai_state
SET embedding_failure = coalesce(
        embedding_failure, CASE WHEN embedding_status = 'FAILED' THEN 'unknown' END),
    keyword_failure = coalesce(
        keyword_failure, CASE WHEN keyword_status = 'FAILED' THEN 'unknown' END)
WHERE (embedding_status = 'FAILED' AND embedding_failure IS NULL)
   OR (keyword_status = 'FAILED' AND keyword_failure IS NULL);

-- The worker writes exactly these two columns here (its fail transitions); its table-wide
-- UPDATE of 0004 already covers them, the grant states it column by column.
GRANT UPDATE (embedding_failure, keyword_failure) ON ai.context_ai_state TO pinlog_ai_worker;
