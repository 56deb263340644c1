-- Preset vectors per embedding profile (docs/contract.md §1, Deviation). One preset (one id,
-- one code, the rows ai.context_keyword.keyword_id references) has one vector per profile, so
-- `pinlog-ai presets load` under one profile never overwrites another profile's vectors.
--   preset_version: the keyword_preset.version whose text was embedded. A vector whose
--     preset_version is not its preset's current version is stale (the list changed since this
--     profile was loaded) and no worker uses it (pinlog_platform/preset_list.py).
--   embedding: VECTOR without a declared dimension: profiles may differ in dimension; each
--     profile's vectors have the one dimension its profile string names (§5).
CREATE TABLE IF NOT EXISTS ai.keyword_preset_embedding (
    preset_id         INT          NOT NULL REFERENCES ai.keyword_preset (id),
    embedding_profile VARCHAR(100) NOT NULL,
    embedding         VECTOR       NOT NULL,
    preset_version    INT          NOT NULL,
    updated_at        TIMESTAMPTZ  NOT NULL DEFAULT now(),
    PRIMARY KEY (preset_id, embedding_profile)
);

-- Every stored vector moves over, as current for its preset's version.
INSERT INTO ai.keyword_preset_embedding (preset_id, embedding_profile, embedding, preset_version)
SELECT id, embedding_profile, embedding, version
FROM ai.keyword_preset
WHERE embedding IS NOT NULL AND embedding_profile IS NOT NULL
ON CONFLICT (preset_id, embedding_profile) DO NOTHING;

-- The old columns stay, nullable and no longer written, so that a worker of the previous
-- version keeps serving (its search and startup read them) until it is replaced; they keep
-- the values of this migration. A later migration drops them.
ALTER TABLE ai.keyword_preset
    ALTER COLUMN embedding DROP NOT NULL,
    ALTER COLUMN embedding_profile DROP NOT NULL;
COMMENT ON COLUMN ai.keyword_preset.embedding IS
    'Frozen by 0050: read ai.keyword_preset_embedding; to be dropped';
COMMENT ON COLUMN ai.keyword_preset.embedding_profile IS
    'Frozen by 0050: read ai.keyword_preset_embedding; to be dropped';

-- The worker's role writes the shared preset columns (presets load) and its profile's
-- vectors, never the frozen columns: column-level INSERT and UPDATE instead of table-level
-- (pinlog_platform/schema/worker_privileges.py declares the same).
REVOKE INSERT, UPDATE ON ai.keyword_preset FROM pinlog_ai_worker;
GRANT INSERT (id, code, display_name, category, description, examples, visibility, is_active,
              version)
    ON ai.keyword_preset TO pinlog_ai_worker;
GRANT UPDATE (display_name, category, description, examples, visibility, is_active, version)
    ON ai.keyword_preset TO pinlog_ai_worker;
GRANT SELECT, INSERT ON ai.keyword_preset_embedding TO pinlog_ai_worker;
GRANT UPDATE (embedding, preset_version, updated_at)
    ON ai.keyword_preset_embedding TO pinlog_ai_worker;
