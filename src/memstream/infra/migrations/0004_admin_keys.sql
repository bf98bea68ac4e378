-- Admin keys (issue 13): a key that may act across the users of its account (browse, edit,
-- export, import and erase memory). Ordinary keys keep the caller's own view.
ALTER TABLE api_keys ADD COLUMN IF NOT EXISTS admin boolean NOT NULL DEFAULT false;

-- Browsing memory entries newest first with a keyset cursor (created_at, owner, key).
CREATE INDEX IF NOT EXISTS memory_entries_browse
    ON memory_entries (account_id, agent_id, created_at DESC, owner DESC, key DESC);
