-- `pinlog-core retry-failed` replaces a live context with a FAILED stage by a new context with
-- the same body (docs/operations.md "Retrying failed notes"): the old one is deleted and
-- names its replacement, so a client that changes or deletes the old id is told (HTTP 409
-- with "replacedBy"). NULL for every other context.
ALTER TABLE core.context
    ADD COLUMN IF NOT EXISTS replaced_by BIGINT NULL REFERENCES core.context (id);
