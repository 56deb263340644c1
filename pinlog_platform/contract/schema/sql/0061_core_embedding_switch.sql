-- The embedding profile in use is a core-table value (docs/contract.md §5, Deviation "profile
-- in use"): one row, written by `pinlog-core reembed`, read by every core replica (cached a
-- few seconds: core_service/service/profile_in_use.py). No row: the profile in use is
-- PINLOG_CORE_EMBEDDING_PROFILE, as before any switch.
--   other_profile: the profile kept complete beside the one in use: the target while
--     backfilling, the previous profile after the cutover (so a rollback loses nothing), the
--     abandoned one after a rollback (until `reembed finish`).
--   state: idle (no switch), backfilling, cut_over; "ready" is backfilling with full coverage.
--   next_batch_at: the backfill's shared pace: a replica takes the next batch only once it is
--     due and moves it on by batch / rate (one conditional UPDATE), so several replicas
--     together keep to rate_per_second.
CREATE TABLE IF NOT EXISTS core.embedding_switch (
    id              SMALLINT     PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    profile_in_use  VARCHAR(100) NOT NULL,
    other_profile   VARCHAR(100) NULL,
    state           VARCHAR(20)  NOT NULL DEFAULT 'idle'
        CHECK (state IN ('idle', 'backfilling', 'cut_over')),
    rate_per_second INT          NOT NULL DEFAULT 50 CHECK (rate_per_second > 0),
    next_batch_at   TIMESTAMPTZ  NOT NULL DEFAULT now(),
    started_at      TIMESTAMPTZ  NULL,
    cut_over_at     TIMESTAMPTZ  NULL,
    updated_at      TIMESTAMPTZ  NOT NULL DEFAULT now(),
    CHECK (state = 'idle' OR other_profile IS NOT NULL),
    CHECK (other_profile IS DISTINCT FROM profile_in_use)
);
GRANT SELECT, INSERT, UPDATE ON core.embedding_switch TO pinlog_core_service;

-- The core proposes backfill rows and reads them; `reembed finish` removes a profile's
-- vectors, backfill rows and preset vectors; `reembed start` stamps judgments made before
-- their profile was recorded.
GRANT SELECT, INSERT, UPDATE, DELETE ON ai.context_embedding_backfill TO pinlog_core_service;
GRANT DELETE ON ai.context_embedding, ai.keyword_preset_embedding TO pinlog_core_service;
GRANT UPDATE (embedding_profile) ON ai.context_keyword_analysis TO pinlog_core_service;
