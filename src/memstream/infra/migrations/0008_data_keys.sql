-- Crypto-shredding of the Kafka copies (issue 13, infra/data_keys.py): one AES-256 data key
-- per thread or user. Records published to Kafka are sealed with them; erasure deletes the
-- key (and vacuums this table), so every copy in every topic becomes unreadable.
CREATE TABLE IF NOT EXISTS data_keys (
    kid         bytea PRIMARY KEY,
    scope       text NOT NULL UNIQUE,
    account_id  text NOT NULL,
    key         bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
