-- Worker-owned: the SHA-256 of the first text seen per context, so a later request with the
-- same context_id and a different text is detected across restarts (CONTRACT §3, scenario 5).
-- Holds a digest only, never the text.
CREATE TABLE IF NOT EXISTS ai.context_text_fingerprint (
    context_id    BIGINT      PRIMARY KEY,
    text_sha256   BYTEA       NOT NULL CHECK (octet_length(text_sha256) = 32),
    first_seen_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_seen_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
