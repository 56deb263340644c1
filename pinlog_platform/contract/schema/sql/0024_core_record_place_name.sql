-- The place name shown on a record is the one its owner gave (issue 18 item 5). core.place
-- keeps the first name any member gave for an external id (it stays the shared key and a
-- fallback), but a record shows and dispatches its own place_name, so a name another member
-- registered first (a right-to-left override, a phishing text) is never shown as the owner's.
-- Backfilled from today's place name; NULL only on rows an older core replica inserts during
-- the rollout, which reads fall back from to core.place.name.
ALTER TABLE core.record ADD COLUMN IF NOT EXISTS place_name VARCHAR(200) NULL;

UPDATE core.record AS r
SET place_name = p.name
FROM core.place AS p
WHERE p.id = r.place_id AND r.place_name IS NULL;
