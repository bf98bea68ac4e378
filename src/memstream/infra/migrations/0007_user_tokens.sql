-- Signed end-user tokens: a per-account HMAC secret (created on first mint) and the
-- setting that makes them mandatory (then X-Memstream-User alone is refused).
ALTER TABLE accounts ADD COLUMN IF NOT EXISTS user_token_secret bytea;
ALTER TABLE accounts ADD COLUMN IF NOT EXISTS require_user_tokens boolean NOT NULL DEFAULT false;
