-- The core schema (CONTRACT §1 "core schema", §9): members, places, records, contexts.
-- Owned by the core service; the worker's role has no privilege here (0004).

CREATE TABLE IF NOT EXISTS core.member (
    id         BIGINT      PRIMARY KEY CHECK (id > 0),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    deleted_at TIMESTAMPTZ NULL
);

CREATE TABLE IF NOT EXISTS core.place (
    id                BIGINT       GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    external_place_id VARCHAR(100) NOT NULL UNIQUE,
    name              VARCHAR(200) NOT NULL,
    created_at        TIMESTAMPTZ  NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS core.record (
    id         BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    member_id  BIGINT      NOT NULL REFERENCES core.member (id),
    place_id   BIGINT      NOT NULL REFERENCES core.place (id),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    deleted_at TIMESTAMPTZ NULL
);

-- At most one active record per member and place; deleted records never block a new one.
CREATE UNIQUE INDEX IF NOT EXISTS record_active_member_place_uq
    ON core.record (member_id, place_id) WHERE deleted_at IS NULL;
CREATE INDEX IF NOT EXISTS record_member_idx ON core.record (member_id);

-- The body is stored normalised (core_service.service.context_body.normalize_body): NFC, the
-- characters listed below trimmed from both ends, 1..500 characters. The list is Python's
-- white space plus invisible format characters and Hangul fillers; a test checks that the
-- domain function and this CHECK agree character by character.
CREATE TABLE IF NOT EXISTS core.context (
    id                BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    record_id         BIGINT      NOT NULL REFERENCES core.record (id),
    member_id         BIGINT      NOT NULL REFERENCES core.member (id),
    body              TEXT        NOT NULL,
    origin_created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    deleted_at        TIMESTAMPTZ NULL,
    CONSTRAINT context_body_normalised CHECK (
        char_length(body) BETWEEN 1 AND 500
        AND body IS NFC NORMALIZED
        AND btrim(body, E'\u0009\u000a\u000b\u000c\u000d\u001c\u001d\u001e\u001f\u0020\u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\u200b\u200c\u200d\u2060\ufeff\u00ad\u180e\u115f\u1160\u3164\uffa0') = body
    )
);

CREATE INDEX IF NOT EXISTS context_active_record_idx
    ON core.context (record_id) WHERE deleted_at IS NULL;
CREATE INDEX IF NOT EXISTS context_member_idx ON core.context (member_id);

-- An ai schema may predate the core tables (a worker deployed first, or the offline demo's
-- earlier runs): new context ids start after every id the state table already holds, so a
-- new context never collides with an old state row.
SELECT setval(
    pg_get_serial_sequence('core.context', 'id'),
    (SELECT coalesce(max(context_id), 0) + 1 FROM ai.context_ai_state),
    false
);
