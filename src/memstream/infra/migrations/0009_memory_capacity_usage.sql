-- The capacity count of the memory writers, under the agent's capacity lock, in one round trip
-- (memstream.agents_ctx.memory.outbox.capacity_usage). The lock is a transaction-scoped
-- advisory lock on hashtextextended('<account>/<agent>', 0). The count is a statement of its
-- own inside a VOLATILE function, so under READ COMMITTED it takes a fresh snapshot after the
-- lock is granted: it sees every entry committed by the lock's previous holders.
-- p_skip: leave out the row at (p_owner, p_key), one the caller's transaction has just written.
CREATE OR REPLACE FUNCTION memstream_capacity_usage(
    p_account text, p_agent text, p_category text, p_user text, p_now timestamptz,
    p_skip boolean, p_owner text, p_key text,
    OUT agent_count bigint, OUT user_count bigint)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(p_account || '/' || p_agent, 0));
    SELECT count(*), count(*) FILTER (WHERE user_id = p_user)
      INTO agent_count, user_count
      FROM memory_entries
     WHERE account_id = p_account AND agent_id = p_agent AND category = p_category
       AND (expires_at IS NULL OR expires_at > p_now)
       AND NOT (p_skip AND owner = p_owner AND key = p_key);
END
$$;
