-- The candidates a judgment chose among (docs/contract.md §4 Addition "candidates kept"), for
-- `pinlog-core inspect`: written by the keyword save's own statement (no new round trip) as a
-- JSON array of [keyword_id, similarity] pairs, best first, similarity rounded to 3 decimals.
-- NULL for judgments saved before this column: inspect shows "not recorded".
-- The worker's table-level INSERT and UPDATE on this table (0004) cover the new column.
ALTER TABLE ai.context_keyword_analysis
    ADD COLUMN IF NOT EXISTS candidates JSONB NULL;
