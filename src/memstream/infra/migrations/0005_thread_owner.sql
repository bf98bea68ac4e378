-- Thread ownership: the user who opened a thread owns it (NULL: opened without a user,
-- shared by the agent). Set once, when the row is inserted, and never changed.
-- Threads created before this migration have no recorded owner and stay shared.
ALTER TABLE threads ADD COLUMN IF NOT EXISTS owner_user text;
