-- The deleted threads of an agent, read by every transcript search (search leaves them
-- out: a deleted thread is not found on any route). A partial index: it holds only the
-- deleted rows, so the read costs what there is to return, not the agent's thread count.
CREATE INDEX IF NOT EXISTS threads_deleted ON threads (account_id, agent_id) WHERE deleted;
