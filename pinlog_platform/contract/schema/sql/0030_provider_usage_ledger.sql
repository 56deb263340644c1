-- What the providers cost (issue H8 item 1): one row per UTC day (on the database clock),
-- provider (embedding, judge), model, and stage (embedding, keyword, search, probe, ...), with
-- the calls, the tokens by kind, how many of them were estimated (the answer carried no
-- `usage`: UTF-8 bytes / 3), and the estimated cost in USD from PINLOG_PROVIDER_PRICES (NULL
-- while the model has no price: tokens only). Written by each worker process in batches, off
-- the stages' transactions (app/service/usage_ledger.py): counts add up across processes.
CREATE TABLE IF NOT EXISTS ai.provider_usage_daily (
    day               DATE           NOT NULL,
    provider          VARCHAR(20)    NOT NULL,
    model             VARCHAR(200)   NOT NULL,
    stage             VARCHAR(20)    NOT NULL,
    calls             BIGINT         NOT NULL DEFAULT 0 CHECK (calls >= 0),
    prompt_tokens     BIGINT         NOT NULL DEFAULT 0 CHECK (prompt_tokens >= 0),
    completion_tokens BIGINT         NOT NULL DEFAULT 0 CHECK (completion_tokens >= 0),
    embedding_tokens  BIGINT         NOT NULL DEFAULT 0 CHECK (embedding_tokens >= 0),
    estimated_tokens  BIGINT         NOT NULL DEFAULT 0 CHECK (estimated_tokens >= 0),
    cost_usd          NUMERIC(20, 10) NULL CHECK (cost_usd >= 0),
    updated_at        TIMESTAMPTZ    NOT NULL DEFAULT now(),
    PRIMARY KEY (day, provider, model, stage)
);

-- The worker inserts a day's first row and adds to it afterwards (INSERT .. ON CONFLICT DO
-- UPDATE needs SELECT, INSERT and UPDATE); it never deletes.
GRANT SELECT, INSERT, UPDATE ON ai.provider_usage_daily TO pinlog_ai_worker;
