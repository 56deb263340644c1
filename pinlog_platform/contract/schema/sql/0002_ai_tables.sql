-- The ai schema of CONTRACT §1. Vectors are 1536-dimensional: the production profile
-- (openai-text-embedding-3-small-1536-cosine-v1) and the offline hashing profile share it.

CREATE TABLE IF NOT EXISTS ai.keyword_preset (
    id                INT PRIMARY KEY,
    code              VARCHAR(50)  NOT NULL UNIQUE,
    display_name      VARCHAR(50)  NOT NULL,
    category          VARCHAR(30)  NOT NULL
        CHECK (category IN ('COMPANION', 'ACTIVITY', 'ATMOSPHERE', 'SITUATION')),
    description       TEXT         NOT NULL,
    examples          TEXT[]       NOT NULL,
    embedding         VECTOR(1536) NOT NULL,
    embedding_profile VARCHAR(100) NOT NULL,
    visibility        VARCHAR(20)  NOT NULL DEFAULT 'PUBLIC'
        CHECK (visibility IN ('PUBLIC', 'PRIVATE_ONLY', 'BLOCKED')),
    is_active         BOOLEAN      NOT NULL DEFAULT true,
    version           INT          NOT NULL DEFAULT 1
);

CREATE TABLE IF NOT EXISTS ai.context_ai_state (
    context_id       BIGINT      PRIMARY KEY,
    embedding_status VARCHAR(20) NOT NULL DEFAULT 'PENDING'
        CHECK (embedding_status IN ('PENDING', 'PROCESSING', 'COMPLETED', 'FAILED', 'CANCELLED')),
    keyword_status   VARCHAR(20) NOT NULL DEFAULT 'PENDING'
        CHECK (keyword_status IN ('PENDING', 'PROCESSING', 'COMPLETED', 'FAILED', 'CANCELLED')),
    retry_count      INT         NOT NULL DEFAULT 0 CHECK (retry_count BETWEEN 0 AND 3),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS ai.context_embedding (
    context_id        BIGINT       PRIMARY KEY,
    user_id           BIGINT       NOT NULL,
    record_id         BIGINT       NOT NULL,
    embedding         VECTOR(1536) NOT NULL,
    embedding_profile VARCHAR(100) NOT NULL,
    is_deleted        BOOLEAN      NOT NULL DEFAULT false,
    updated_at        TIMESTAMPTZ  NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS ai.context_keyword (
    context_id     BIGINT       NOT NULL,
    keyword_id     INT          NOT NULL REFERENCES ai.keyword_preset (id),
    confidence     NUMERIC(4,3) NULL CHECK (confidence BETWEEN 0 AND 1),
    preset_version INT          NOT NULL,
    PRIMARY KEY (context_id, keyword_id)
);

CREATE TABLE IF NOT EXISTS ai.context_keyword_analysis (
    context_id         BIGINT       PRIMARY KEY,
    preset_version     INT          NOT NULL,
    unmatched_concepts JSONB        NOT NULL DEFAULT '[]',
    model_profile      VARCHAR(100) NOT NULL,
    updated_at         TIMESTAMPTZ  NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS context_embedding_user_deleted_idx
    ON ai.context_embedding (user_id, is_deleted);
CREATE INDEX IF NOT EXISTS context_embedding_record_idx
    ON ai.context_embedding (record_id);
CREATE INDEX IF NOT EXISTS context_ai_state_embedding_idx
    ON ai.context_ai_state (embedding_status, updated_at);
CREATE INDEX IF NOT EXISTS context_ai_state_keyword_idx
    ON ai.context_ai_state (keyword_status, updated_at);
CREATE INDEX IF NOT EXISTS context_keyword_keyword_idx
    ON ai.context_keyword (keyword_id);
