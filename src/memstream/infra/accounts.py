"""Tenancy in Postgres: accounts, hashed API keys, agents (Memory capability) and threads.

API keys are stored only as sha256 hashes; a key is shown once, when created. Agents and
threads are created implicitly on first use (Memory unbound, default config) or explicitly.
A deleted thread keeps its journal, summary and memory (the spec's "not built" note): only
the record is flagged.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from memstream.schemas.records import JSONObject, ThreadConfig, ThreadRef

KEY_PREFIX = "msk_"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """What an API key grants: its account, and whether it is an admin key."""

    account_id: str
    admin: bool = False


@dataclass(frozen=True, slots=True)
class KeyListing:
    """One API key as ``memstream keys list`` shows it (the key itself is never stored)."""

    prefix: str
    admin: bool
    created_at: datetime
    revoked_at: datetime | None


@dataclass(frozen=True, slots=True)
class TokenPolicy:
    """An account's user-token secret (None until the first mint) and whether tokens are
    required."""

    secret: bytes | None
    required: bool


@dataclass(frozen=True, slots=True)
class Agent:
    account_id: str
    agent_id: str
    memory: bool


@dataclass(frozen=True, slots=True)
class Thread:
    """A thread record. ``owner`` is the user who opened it (None: shared by the agent)."""

    ref: ThreadRef
    metadata: JSONObject
    deleted: bool
    owner: str | None = None

    @property
    def config(self) -> ThreadConfig:
        cfg = self.metadata.get("config")
        return ThreadConfig.from_dict(cfg if isinstance(cfg, dict) else None)


class Accounts:
    """Repository over the core tables. Every method is one short transaction."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        known_agents_max: int = 100_000,
        key_cache_ttl_s: float = 5.0,
    ) -> None:
        self.pool = pool
        # Authenticated keys are remembered briefly so a turn's requests cost no key lookup;
        # a revoked key therefore keeps working for at most ``key_cache_ttl_s`` seconds.
        self._key_cache: dict[str, tuple[KeyInfo, float]] = {}
        self._key_cache_ttl = key_cache_ttl_s
        # Agents are never deleted, so "this agent exists" can be remembered: read routes
        # then skip the upsert (a write) they would otherwise make on every request.
        self._known_agents: set[tuple[str, str]] = set()
        self._known_agents_max = known_agents_max
        # The Memory binding, remembered as briefly as keys; configure_agent through this
        # instance refreshes it at once.
        self._memory_cache: dict[tuple[str, str], tuple[bool, float]] = {}
        self._token_cache: dict[str, tuple[TokenPolicy, float]] = {}
        self._known_accounts: set[str] = set()

    async def touch_agent(self, account_id: str, agent_id: str) -> None:
        """Make sure the agent exists (implicit creation on first use), cheaply."""
        if (account_id, agent_id) in self._known_agents:
            return
        await self.ensure_agent(account_id, agent_id)
        if len(self._known_agents) >= self._known_agents_max:
            self._known_agents.clear()
        self._known_agents.add((account_id, agent_id))

    async def account_exists(self, account_id: str) -> bool:
        """Whether the account exists (accounts are never deleted: a yes is remembered)."""
        if account_id in self._known_accounts:
            return True
        found = await self.pool.fetchval("SELECT 1 FROM accounts WHERE account_id = $1", account_id)
        if found is not None:
            if len(self._known_accounts) >= self._known_agents_max:
                self._known_accounts.clear()
            self._known_accounts.add(account_id)
        return found is not None

    async def ensure_account(self, account_id: str) -> None:
        await self.pool.execute(
            "INSERT INTO accounts (account_id) VALUES ($1) ON CONFLICT DO NOTHING", account_id
        )

    async def create_key(self, account_id: str, *, admin: bool = False) -> str:
        """Create a new API key for ``account_id`` (creating the account) and return it.
        An ``admin`` key may act across the account's users (browse, edit, export, erase)."""
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        await self.add_key(account_id, key, admin=admin)
        return key

    async def add_key(self, account_id: str, key: str, *, admin: bool = False) -> None:
        """Register a known key (``MEMSTREAM_API_KEYS`` seeding). Idempotent (an existing
        key keeps its admin flag)."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "INSERT INTO accounts (account_id) VALUES ($1) ON CONFLICT DO NOTHING", account_id
            )
            owner = await conn.fetchval(
                "SELECT account_id FROM api_keys WHERE key_hash = $1", hash_key(key)
            )
            if owner is not None and owner != account_id:
                raise ValueError("this API key already belongs to another account")
            await conn.execute(
                "INSERT INTO api_keys (account_id, key_hash, key_prefix, admin)"
                " VALUES ($1, $2, $3, $4) ON CONFLICT (key_hash) DO NOTHING",
                account_id,
                hash_key(key),
                key[:8],
                admin,
            )

    async def revoke_key(self, key: str) -> str | None:
        """Revoke ``key``: the account it belonged to, or None if it is unknown or was
        already revoked (:meth:`key_revoked` tells those apart). This process refuses it at
        once; other API processes once their cache of it expires (``key_cache_ttl_s``, 5 s
        by default)."""
        digest = hash_key(key)
        account = await self.pool.fetchval(
            "UPDATE api_keys SET revoked_at = now() WHERE key_hash = $1 AND revoked_at IS NULL"
            " RETURNING account_id",
            digest,
        )
        self._key_cache.pop(digest, None)
        return None if account is None else str(account)

    async def key_revoked(self, key: str) -> str | None:
        """The account of ``key`` if it was revoked already, else None (unknown or live)."""
        account = await self.pool.fetchval(
            "SELECT account_id FROM api_keys WHERE key_hash = $1 AND revoked_at IS NOT NULL",
            hash_key(key),
        )
        return None if account is None else str(account)

    async def list_keys(self, account_id: str) -> list[KeyListing]:
        """The account's keys, oldest first: never the key, only its first characters."""
        rows = await self.pool.fetch(
            "SELECT key_prefix, admin, created_at, revoked_at FROM api_keys"
            " WHERE account_id = $1 ORDER BY created_at, key_prefix",
            account_id,
        )
        return [
            KeyListing(r["key_prefix"], bool(r["admin"]), r["created_at"], r["revoked_at"])
            for r in rows
        ]

    async def authenticate(self, key: str) -> str | None:
        """The account a key belongs to, or None if unknown or revoked (cached briefly)."""
        info = await self.key_info(key)
        return None if info is None else info.account_id

    async def key_info(self, key: str) -> KeyInfo | None:
        """What a key grants, or None if unknown or revoked (cached briefly)."""
        digest = hash_key(key)
        now = time.monotonic()
        hit = self._key_cache.get(digest)
        if hit is not None and hit[1] > now:
            return hit[0]
        row = await self.pool.fetchrow(
            "SELECT account_id, admin FROM api_keys WHERE key_hash = $1 AND revoked_at IS NULL",
            digest,
        )
        if row is None:
            self._key_cache.pop(digest, None)
            return None
        if len(self._key_cache) > 10_000:
            self._key_cache.clear()
        info = KeyInfo(str(row["account_id"]), bool(row["admin"]))
        self._key_cache[digest] = (info, now + self._key_cache_ttl)
        return info

    # --- signed end-user tokens ----------------------------------------------------------------
    async def user_token_secret(self, account_id: str, *, create: bool = False) -> bytes | None:
        """The account's HMAC secret for user tokens (made on first use when ``create``)."""
        if create:
            await self.pool.execute(
                "UPDATE accounts SET user_token_secret = $2"
                " WHERE account_id = $1 AND user_token_secret IS NULL",
                account_id,
                secrets.token_bytes(32),
            )
            self._token_cache.pop(account_id, None)  # a policy cached without the secret
        hit = self._token_cache.get(account_id)
        now = time.monotonic()
        if hit is not None and hit[1] > now:
            return hit[0].secret
        row = await self.pool.fetchrow(
            "SELECT user_token_secret, require_user_tokens FROM accounts WHERE account_id = $1",
            account_id,
        )
        if row is None:
            return None
        policy = TokenPolicy(row["user_token_secret"], bool(row["require_user_tokens"]))
        self._token_cache[account_id] = (policy, now + self._key_cache_ttl)
        return policy.secret

    async def requires_user_tokens(self, account_id: str) -> bool:
        await self.user_token_secret(account_id)
        hit = self._token_cache.get(account_id)
        return hit is not None and hit[0].required

    async def set_require_user_tokens(self, account_id: str, required: bool) -> bool:
        """Turn the account setting on or off; False if there is no such account."""
        status = await self.pool.execute(
            "UPDATE accounts SET require_user_tokens = $2 WHERE account_id = $1",
            account_id,
            required,
        )
        self._token_cache.pop(account_id, None)
        return str(status).endswith(" 1")

    async def ensure_agent(self, account_id: str, agent_id: str) -> Agent:
        row = await self.pool.fetchrow(
            "INSERT INTO agents (account_id, agent_id) VALUES ($1, $2)"
            " ON CONFLICT (account_id, agent_id) DO UPDATE SET agent_id = EXCLUDED.agent_id"
            " RETURNING account_id, agent_id, memory",
            account_id,
            agent_id,
        )
        assert row is not None
        return Agent(row["account_id"], row["agent_id"], row["memory"])

    async def get_agent(self, account_id: str, agent_id: str) -> Agent | None:
        row = await self.pool.fetchrow(
            "SELECT account_id, agent_id, memory FROM agents WHERE account_id=$1 AND agent_id=$2",
            account_id,
            agent_id,
        )
        return None if row is None else Agent(row["account_id"], row["agent_id"], row["memory"])

    async def memory_bound(self, account_id: str, agent_id: str) -> bool:
        """Whether the agent has the Memory capability bound (cached ``key_cache_ttl_s``)."""
        now = time.monotonic()
        hit = self._memory_cache.get((account_id, agent_id))
        if hit is not None and hit[1] > now:
            return hit[0]
        agent = await self.get_agent(account_id, agent_id)
        bound = agent is not None and agent.memory
        if len(self._memory_cache) > 10_000:
            self._memory_cache.clear()
        self._memory_cache[(account_id, agent_id)] = (bound, now + self._key_cache_ttl)
        return bound

    async def configure_agent(self, account_id: str, agent_id: str, *, memory: bool) -> Agent:
        row = await self.pool.fetchrow(
            "INSERT INTO agents (account_id, agent_id, memory) VALUES ($1, $2, $3)"
            " ON CONFLICT (account_id, agent_id)"
            " DO UPDATE SET memory = EXCLUDED.memory, updated_at = now()"
            " RETURNING account_id, agent_id, memory",
            account_id,
            agent_id,
            memory,
        )
        assert row is not None
        self._memory_cache.pop((account_id, agent_id), None)
        return Agent(row["account_id"], row["agent_id"], row["memory"])

    async def create_thread(
        self, ref: ThreadRef, metadata: JSONObject, owner: str | None = None
    ) -> tuple[Thread | None, bool]:
        """Create the thread for ``owner`` (None: shared), or return the existing one,
        reviving it with ``metadata`` if it was deleted. Returns (thread, created).

        The thread is None, and nothing is changed, when it exists with another owner (a
        thread's owner is set once, at insert, and never changes: another user's thread, or
        a shared one asked for by a user, which would stay shared), or was erased
        (:meth:`thread_erased`: an erased id is never revived, since every projection
        drops what a registered thread writes)."""
        await self.ensure_agent(ref.account_id, ref.agent_id)
        row = await self.pool.fetchrow(
            "INSERT INTO threads (account_id, agent_id, thread_id, metadata, owner_user)"
            " VALUES ($1,$2,$3,$4,$5)"
            " ON CONFLICT (account_id, agent_id, thread_id) DO UPDATE"
            "   SET metadata = CASE WHEN threads.deleted THEN EXCLUDED.metadata"
            "                       ELSE threads.metadata END,"
            "       deleted = false, updated_at = now()"
            "   WHERE threads.owner_user IS NOT DISTINCT FROM EXCLUDED.owner_user"
            "     AND NOT EXISTS (SELECT 1 FROM erased_threads e WHERE e.account_id = $1"
            "                     AND e.agent_id = $2 AND e.thread_id = $3)"
            " RETURNING metadata, deleted, owner_user, (xmax = 0) AS created",
            ref.account_id,
            ref.agent_id,
            ref.thread_id,
            metadata,
            owner,
        )
        if row is None:
            return None, False
        thread = Thread(ref, row["metadata"], row["deleted"], row["owner_user"])
        return thread, bool(row["created"])

    async def thread_erased(self, ref: ThreadRef) -> bool:
        """Whether an erasure registered the thread (``erased_threads``)."""
        return bool(
            await self.pool.fetchval(
                "SELECT EXISTS (SELECT 1 FROM erased_threads"
                " WHERE account_id = $1 AND agent_id = $2 AND thread_id = $3)",
                ref.account_id,
                ref.agent_id,
                ref.thread_id,
            )
        )

    async def open_thread(self, ref: ThreadRef, owner: str | None) -> tuple[Thread, bool]:
        """The thread as it is, inserting it (for ``owner``, default config) if it has no
        record yet. Never revives a deleted thread, never changes an existing one."""
        row = await self.pool.fetchrow(
            "INSERT INTO threads (account_id, agent_id, thread_id, owner_user)"
            " VALUES ($1,$2,$3,$4)"
            " ON CONFLICT (account_id, agent_id, thread_id) DO NOTHING"
            " RETURNING metadata, deleted, owner_user",
            ref.account_id,
            ref.agent_id,
            ref.thread_id,
            owner,
        )
        if row is not None:
            return Thread(ref, row["metadata"], row["deleted"], row["owner_user"]), True
        existing = await self.get_thread(ref)
        assert existing is not None  # rows are never removed
        return existing, False

    async def get_thread(self, ref: ThreadRef) -> Thread | None:
        row = await self.pool.fetchrow(
            "SELECT metadata, deleted, owner_user FROM threads"
            " WHERE account_id=$1 AND agent_id=$2 AND thread_id=$3",
            ref.account_id,
            ref.agent_id,
            ref.thread_id,
        )
        if row is None:
            return None
        return Thread(ref, row["metadata"], row["deleted"], row["owner_user"])

    async def deleted_threads(self, account_id: str, agent_id: str) -> frozenset[str]:
        """The ids of the agent's deleted threads (``threads_deleted``, a partial index)."""
        rows = await self.pool.fetch(
            "SELECT thread_id FROM threads WHERE account_id=$1 AND agent_id=$2 AND deleted",
            account_id,
            agent_id,
        )
        return frozenset(str(r["thread_id"]) for r in rows)

    async def delete_thread(self, ref: ThreadRef) -> bool:
        """Flag the thread record deleted. Journal, summary and memory are kept."""
        status = await self.pool.execute(
            "UPDATE threads SET deleted = true, updated_at = now()"
            " WHERE account_id=$1 AND agent_id=$2 AND thread_id=$3 AND NOT deleted",
            ref.account_id,
            ref.agent_id,
            ref.thread_id,
        )
        return str(status).endswith(" 1")
