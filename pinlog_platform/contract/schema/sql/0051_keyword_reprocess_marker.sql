-- A core-only column of ai.context_ai_state (docs/contract.md §9, Deviation "keywords while
-- re-judged"): the preset list version an operational reset (`pinlog-core reprocess keywords`,
-- the §0 COMPLETED -> PENDING reset of the keyword stage) sent this keyword stage back for;
-- NULL when no reprocess ever did. While it is set and the keyword stage is not COMPLETED (nor
-- CANCELLED), the stored keyword rows are the previous judgment and reads keep showing them;
-- the keyword save replaces them in one statement. The worker never reads or writes it (no
-- grant): a completed stage shows its keywords whatever the column holds.
-- Adding a nullable column without a default rewrites nothing (no table scan, a brief lock).
ALTER TABLE ai.context_ai_state
    ADD COLUMN IF NOT EXISTS keyword_reprocess_version INT NULL;
