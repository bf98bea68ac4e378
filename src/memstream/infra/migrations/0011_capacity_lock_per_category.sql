-- The capacity lock is per (account, agent, category) instead of per (account, agent): the
-- count it guards is of one category (the limits are per category), so stores of different
-- categories of one agent no longer wait for each other's count and commit (issue 15).
-- Same function, same arguments, same answers (memstream.agents_ctx.memory.outbox.capacity_usage);
-- every memory writer calls it, so every writer takes the same lock for a category.
CREATE OR REPLACE FUNCTION memstream_capacity_usage(
    p_account text, p_agent text, p_category text, p_user text, p_now timestamptz,
    p_skip boolean, p_owner text, p_key text,
    OUT agent_count bigint, OUT user_count bigint)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(
        hashtextextended(p_account || '/' || p_agent || '/' || p_category, 0));
    SELECT count(*), count(*) FILTER (WHERE user_id = p_user)
      INTO agent_count, user_count
      FROM memory_entries
     WHERE account_id = p_account AND agent_id = p_agent AND category = p_category
       AND (expires_at IS NULL OR expires_at > p_now)
       AND NOT (p_skip AND owner = p_owner AND key = p_key);
END
$$;
