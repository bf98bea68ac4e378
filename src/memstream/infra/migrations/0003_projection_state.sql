-- Projection generations ("current" pointers) and replay checkpoints (memstream replay).
-- One row per projection (messages, memory, counters). `generation` is the one readers and
-- the live projector use; `replay` is the checkpoint of a rebuild in progress (NULL when none).
CREATE TABLE IF NOT EXISTS projection_state (
    name        text PRIMARY KEY,
    generation  integer NOT NULL DEFAULT 1,
    replay      jsonb,
    updated_at  timestamptz NOT NULL DEFAULT now()
);
