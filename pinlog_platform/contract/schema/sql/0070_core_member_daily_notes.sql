-- The daily note cap of the client API (PINLOG_CORE_MEMBER_DAILY_NOTES): one row per member,
-- the notes it created on the UTC day `day`. Taken inside the statement that writes the new
-- context (core_service/repository/member_daily_notes.py), after the record's lock and before
-- the context (docs/lock-order.md): the row lock serialises one member's concurrent creates,
-- and the conditional UPSERT re-reads the count under it, so the cap is never overrun.
CREATE TABLE IF NOT EXISTS core.member_daily_notes (
    member_id BIGINT  PRIMARY KEY,
    day       DATE    NOT NULL,
    notes     INTEGER NOT NULL CHECK (notes >= 0)
);

GRANT SELECT, INSERT, UPDATE ON core.member_daily_notes TO pinlog_core_service;
