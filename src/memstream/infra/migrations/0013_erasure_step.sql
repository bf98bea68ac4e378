-- What an erasure is doing now, or where a run that failed stopped (issue: long rewrites of
-- a large index showed no progress); null once done. Written at each step of
-- memstream.agents_ctx.erasure and answered by GET /v1/erasures/{id}.
ALTER TABLE erasures ADD COLUMN IF NOT EXISTS step text;
