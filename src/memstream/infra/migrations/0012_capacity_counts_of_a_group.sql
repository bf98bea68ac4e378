-- The capacity counts of a group of stores written in one transaction (group commit, issue 15;
-- memstream.agents_ctx.memory.batch_store). Takes the capacity lock of every (account, agent,
-- category) of the group, in sorted order (two groups never wait for each other in a cycle; every
-- other writer holds at most one of these locks and waits for nothing once it has it), then counts
-- the live entries of each, per user_id, in a statement of its own: under READ COMMITTED it takes
-- a fresh snapshot after the locks are granted, so it sees every entry committed by their previous
-- holders, and the group's own writes (same transaction). Same locks as memstream_capacity_usage.
CREATE OR REPLACE FUNCTION memstream_capacity_counts(
    p_account text, p_agents text[], p_categories text[], p_now timestamptz)
RETURNS TABLE (o_agent text, o_category text, o_user text, o_count bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    g record;
BEGIN
    FOR g IN SELECT DISTINCT u.a, u.c FROM unnest(p_agents, p_categories) AS u(a, c)
             ORDER BY u.a, u.c LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended(p_account || '/' || g.a || '/' || g.c, 0));
    END LOOP;
    RETURN QUERY
    SELECT e.agent_id, e.category, e.user_id, count(*)
      FROM (SELECT DISTINCT u.a, u.c FROM unnest(p_agents, p_categories) AS u(a, c)) AS gr
      JOIN memory_entries AS e
        ON e.account_id = p_account AND e.agent_id = gr.a AND e.category = gr.c
     WHERE e.expires_at IS NULL OR e.expires_at > p_now
     GROUP BY e.agent_id, e.category, e.user_id;
END
$$;
