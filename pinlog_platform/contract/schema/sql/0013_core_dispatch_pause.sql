-- Whether the core side may send work to the workers (docs/operations.md "Pause"):
-- `pinlog-core pause` / `resume` write the one row; no row reads as running. While paused,
-- creates, edits and deletes commit as usual, no dispatch is sent, the rescan claims nothing
-- and the finalizer fails nothing.
CREATE TABLE IF NOT EXISTS core.dispatch_control (
    singleton  BOOLEAN     PRIMARY KEY DEFAULT true CHECK (singleton),
    paused     BOOLEAN     NOT NULL,
    changed_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
