-- The embedding-profile switch's fourth state and its generation (docs/operations.md
-- "Switching the embedding profile"; core_service/repository/embedding_switch.py).
--   rolling_back: after a rollback from cut_over the restored profile is in use and
--     other_profile is the abandoned one; the core processes' backfill loop fills the
--     restored profile's gaps (notes embedded under the abandoned one while every process's
--     cached profile caught up) and moves the switch to idle itself once none is left.
--   generation: + 1 on every move of the switch (start, cutover, rollback, finish, the loop's
--     move to idle), never on the backfill's pace: a command's guarded move names the
--     generation it read and is refused when the row changed meanwhile.
-- A new column with a constant default and a CHECK on a one-row table: no rewrite to speak of.
ALTER TABLE core.embedding_switch ADD COLUMN IF NOT EXISTS generation BIGINT NOT NULL DEFAULT 1;
ALTER TABLE core.embedding_switch DROP CONSTRAINT IF EXISTS embedding_switch_state_check;
ALTER TABLE core.embedding_switch ADD CONSTRAINT embedding_switch_state_check
    CHECK (state IN ('idle', 'backfilling', 'cut_over', 'rolling_back'));
