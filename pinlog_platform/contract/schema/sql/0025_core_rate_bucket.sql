-- Token buckets of the member quotas (issue 18 item 2; pinlog_platform/token_bucket.py):
-- one row per member and kind ('write:<id>', 'search:<id>'), shared by every core replica and
-- refilled on the database clock. Written in a short transaction of its own, before the
-- request's, so no request transaction ever holds a bucket row (docs/lock-order.md).
CREATE TABLE IF NOT EXISTS core.rate_bucket (
    bucket_key  TEXT             PRIMARY KEY,
    tokens      DOUBLE PRECISION NOT NULL,
    refilled_at TIMESTAMPTZ      NOT NULL,
    granted     BOOLEAN          NOT NULL
);

GRANT SELECT, INSERT, UPDATE ON core.rate_bucket TO pinlog_core_service;
