-- Cached prompt tokens (issue 34, J7 item 2): the part of `prompt_tokens` the provider served
-- from its prompt cache (`usage.prompt_tokens_details.cached_tokens` of chat and embedding
-- answers), priced at the model's `cached_prompt` price instead of its `prompt` price. A part
-- of `prompt_tokens`, never added to the totals again. The worker's table-level INSERT and
-- UPDATE (0030) cover the new column.
ALTER TABLE ai.provider_usage_daily
    ADD COLUMN IF NOT EXISTS cached_prompt_tokens BIGINT NOT NULL DEFAULT 0
        CHECK (cached_prompt_tokens >= 0);
