-- Erasure (issue 13): the entry states erasure removed. The `memory` topic still holds their
-- earlier memory.stored events (with content); the recall index never applies an upsert at
-- or below the erased version (so replay memory neither re-indexes nor re-embeds them).
CREATE TABLE IF NOT EXISTS erased_entries (
    account_id  text NOT NULL,
    agent_id    text NOT NULL,
    owner       text NOT NULL,
    key         text NOT NULL,
    version     bigint NOT NULL,
    erasure_id  text NOT NULL,
    PRIMARY KEY (account_id, agent_id, owner, key)
);
