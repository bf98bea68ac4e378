-- memstream: no-transaction
-- The deleted threads of an agent, read by every transcript search (search leaves them
-- out: a deleted thread is not found on any route). A partial index: it holds only the
-- deleted rows, so the read costs what there is to return, not the agent's thread count.
-- Built CONCURRENTLY, so an upgrade never blocks thread writes while it scans the table. A
-- build cut short leaves an invalid index of that name, dropped first when this runs again.
DROP INDEX CONCURRENTLY IF EXISTS threads_deleted;
CREATE INDEX CONCURRENTLY threads_deleted ON threads (account_id, agent_id) WHERE deleted;
