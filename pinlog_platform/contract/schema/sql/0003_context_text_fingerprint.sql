-- Worker-owned: what the first request said about each context (the SHA-256 of its text, its
-- user and record), so a later request with the same context_id that disagrees is detected
-- across restarts (CONTRACT §0 principle 1, §3, scenario 5). A digest only, never the text.
CREATE TABLE IF NOT EXISTS ai.context_text_fingerprint (
    context_id    BIGINT      PRIMARY KEY,
    user_id       BIGINT      NOT NULL,
    record_id     BIGINT      NOT NULL,
    text_sha256   BYTEA       NOT NULL CHECK (octet_length(text_sha256) = 32),
    first_seen_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_seen_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
