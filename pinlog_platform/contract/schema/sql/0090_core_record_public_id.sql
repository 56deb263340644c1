-- A record's public id (docs/core-service.md "Another member's view"): record ids are
-- sequential, so another member reads a record's public view by this id instead and a record
-- id names only the caller's own record. 22 characters: the base64url spelling, without
-- padding, of 128 random bits, taken from three gen_random_uuid() values (PostgreSQL's strong
-- random source) at bytes that a version 4 UUID leaves wholly random: 1-6, 10-16 and 1-3.
-- The default fills every existing row with a value of its own (a volatile default rewrites
-- the table) and every row a core inserts: the create statement's record insert returns it.
ALTER TABLE core.record
    ADD COLUMN IF NOT EXISTS public_id VARCHAR(22) NOT NULL
    DEFAULT translate(rtrim(encode(
        substring(uuid_send(gen_random_uuid()) FROM 1 FOR 6)
        || substring(uuid_send(gen_random_uuid()) FROM 10 FOR 7)
        || substring(uuid_send(gen_random_uuid()) FROM 1 FOR 3),
        'base64'), '='), '+/', '-_')
    CONSTRAINT record_public_id_form CHECK (public_id ~ '^[A-Za-z0-9_-]{22}$');

-- The public read finds a record by it; a (vanishingly unlikely) repeat fails the insert.
CREATE UNIQUE INDEX IF NOT EXISTS record_public_id_key ON core.record (public_id);
