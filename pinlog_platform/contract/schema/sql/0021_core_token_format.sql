-- When this database's core side started issuing tokens with kid, iss and aud (issue 18 item 3,
-- docs/operations.md "Signing keys"). A token without them (issued before the upgrade, or by a
-- replica not yet upgraded during the rollout) is accepted against the current key only while
-- the database clock is before upgraded_at + the token lifetime cap. One row; every replica
-- reads the same moment, so replicas agree without configuration.
CREATE TABLE IF NOT EXISTS core.token_format (
    singleton   BOOLEAN     PRIMARY KEY DEFAULT true CHECK (singleton),
    upgraded_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

INSERT INTO core.token_format (singleton) VALUES (true) ON CONFLICT (singleton) DO NOTHING;
