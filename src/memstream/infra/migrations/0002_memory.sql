-- Agent memory: curated entries (authoritative) and the outbox that feeds the `memory` topic.
-- Every table leads with account_id. An entry's identity is (account, agent, owner, key),
-- owner = the user for a private entry, '' for a shared one.

CREATE SEQUENCE IF NOT EXISTS memory_version_seq;

CREATE TABLE IF NOT EXISTS memory_entries (
    account_id        text NOT NULL,
    agent_id          text NOT NULL,
    owner             text NOT NULL DEFAULT '',
    key               text NOT NULL,
    content           text NOT NULL,
    category          text NOT NULL
        CHECK (category IN ('user_profile', 'project_fact', 'observation')),
    visibility        text NOT NULL CHECK (visibility IN ('private', 'shared')),
    importance        double precision NOT NULL CHECK (importance >= 0 AND importance <= 1),
    user_id           text,
    content_hash      text NOT NULL,
    expires_at        timestamptz,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    recall_count      bigint NOT NULL DEFAULT 0,
    last_recalled_at  timestamptz,
    last_decayed_at   timestamptz,
    -- from memory_version_seq: grows on every change, also across forget + re-store, so
    -- projections can drop stale events by comparing versions.
    version           bigint NOT NULL,
    search            tsvector GENERATED ALWAYS AS
        (to_tsvector('english', key || ' ' || content)) STORED,
    PRIMARY KEY (account_id, agent_id, owner, key),
    CHECK ((visibility = 'private') = (owner <> ''))
);

-- capacity counts and listings per category
CREATE INDEX IF NOT EXISTS memory_entries_category
    ON memory_entries (account_id, agent_id, category);
CREATE INDEX IF NOT EXISTS memory_entries_user
    ON memory_entries (account_id, agent_id, user_id, category);
-- pinned facts: user_profile by importance
CREATE INDEX IF NOT EXISTS memory_entries_pinned
    ON memory_entries (account_id, agent_id, importance DESC, updated_at DESC)
    WHERE category = 'user_profile';
-- hygiene scans
CREATE INDEX IF NOT EXISTS memory_entries_expiry
    ON memory_entries (expires_at) WHERE expires_at IS NOT NULL;
-- keyword fallback of recall
CREATE INDEX IF NOT EXISTS memory_entries_search ON memory_entries USING gin (search);

CREATE TABLE IF NOT EXISTS memory_outbox (
    id            bigserial PRIMARY KEY,
    account_id    text NOT NULL,
    agent_id      text NOT NULL,
    event_id      text NOT NULL,
    event         bytea NOT NULL,          -- the encoded envelope, published as is
    created_at    timestamptz NOT NULL DEFAULT now(),
    published_at  timestamptz
);
CREATE INDEX IF NOT EXISTS memory_outbox_pending
    ON memory_outbox (id) WHERE published_at IS NULL;
