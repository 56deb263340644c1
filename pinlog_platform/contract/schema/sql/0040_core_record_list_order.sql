-- The owner's list of records (GET /api/v1/records, core_service/repository/record_page.py):
-- a member's active records newest first by (created_at, id), each page read from its key
-- onward, so a page costs its own size whatever the member's history.
CREATE INDEX IF NOT EXISTS record_member_active_created_idx
    ON core.record (member_id, created_at DESC, id DESC) WHERE deleted_at IS NULL;
