-- Erasure (issue 13): one row per erasure (what, how far, what each store removed), and the
-- registry of erased threads that consumers and replays consult so nothing brings them back.
CREATE TABLE IF NOT EXISTS erasures (
    erasure_id   text PRIMARY KEY,
    account_id   text NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('thread', 'user')),
    agent_id     text,
    thread_id    text,
    user_id      text,
    status       text NOT NULL DEFAULT 'running' CHECK (status IN ('running', 'done')),
    stores       jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at   timestamptz NOT NULL DEFAULT now(),
    finished_at  timestamptz
);
CREATE INDEX IF NOT EXISTS erasures_running ON erasures (created_at) WHERE status = 'running';

CREATE TABLE IF NOT EXISTS erased_threads (
    account_id  text NOT NULL,
    agent_id    text NOT NULL,
    thread_id   text NOT NULL,
    erasure_id  text NOT NULL,
    erased_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, agent_id, thread_id)
);
