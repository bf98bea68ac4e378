-- What each processor applied, per partition of its input topic (streams/coverage.py):
-- sorted disjoint half-open offset ranges [[lo, hi], ...]. `memstream lag` reports the
-- offsets below the committed one that no range covers as the projection's gap.
CREATE TABLE IF NOT EXISTS projection_coverage (
    grp         text NOT NULL,
    topic       text NOT NULL,
    part        integer NOT NULL,
    ranges      jsonb NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (grp, topic, part)
);
