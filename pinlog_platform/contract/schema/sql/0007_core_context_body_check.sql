-- The body CHECK of core.context without its NFC clause. PostgreSQL's Unicode tables and the
-- service's (Python's unicodedata) can be of different Unicode versions: a combining mark
-- added in a newer version is reordered by one and not the other, so `body IS NFC NORMALIZED`
-- refused bodies the service had normalised, and the insert failed. NFC stays the domain's
-- rule (core_service.service.context_body); the database keeps the version-independent parts:
-- the edge characters trimmed and the length.
ALTER TABLE core.context DROP CONSTRAINT IF EXISTS context_body_normalised;
ALTER TABLE core.context ADD CONSTRAINT context_body_normalised CHECK (
    char_length(body) BETWEEN 1 AND 500
    AND btrim(body, E'\u0009\u000a\u000b\u000c\u000d\u001c\u001d\u001e\u001f\u0020\u0085\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\u200b\u200c\u200d\u2060\ufeff\u00ad\u180e\u115f\u1160\u3164\uffa0') = body
);
