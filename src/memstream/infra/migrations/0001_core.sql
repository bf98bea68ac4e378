-- Core tenancy: accounts, hashed API keys, agents (Memory capability), threads.
-- Every table leads with account_id, ready for partitioning by account.

CREATE TABLE IF NOT EXISTS accounts (
    account_id  text PRIMARY KEY,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS api_keys (
    account_id  text NOT NULL REFERENCES accounts(account_id),
    key_hash    text NOT NULL,          -- sha256 hex of the key; the key itself is never stored
    key_prefix  text NOT NULL,          -- first characters, to tell keys apart in listings
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz,
    PRIMARY KEY (key_hash)
);
CREATE INDEX IF NOT EXISTS api_keys_account ON api_keys (account_id);

CREATE TABLE IF NOT EXISTS agents (
    account_id  text NOT NULL REFERENCES accounts(account_id),
    agent_id    text NOT NULL,
    memory      boolean NOT NULL DEFAULT false,   -- Memory capability bound
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, agent_id)
);

CREATE TABLE IF NOT EXISTS threads (
    account_id  text NOT NULL,
    agent_id    text NOT NULL,
    thread_id   text NOT NULL,
    metadata    jsonb NOT NULL DEFAULT '{}'::jsonb,
    deleted     boolean NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (account_id, agent_id, thread_id),
    FOREIGN KEY (account_id, agent_id) REFERENCES agents(account_id, agent_id)
);
