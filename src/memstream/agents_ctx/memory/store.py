"""``MemoryService``: the three memory tools (store, recall, forget) and the pinned-set query,
over Postgres (authoritative) and an optional semantic index.

Guarantees:

- **Atomic**: every change to an entry and its ``memory.*`` outbox event are written in one
  transaction; a rejected call writes nothing.
- **Capacity holds under concurrency**: stores of one (account, agent) are serialised by a
  transaction-scoped advisory lock around the count-then-write.
- **Isolation**: every statement filters by account and agent; a caller sees the agent's
  shared entries plus its own private ones, nothing else (also in forget and recall).
- **Recall never trusts the index**: candidates from the index are re-fetched from Postgres
  with visibility, expiry and the category filter applied again. If the index is missing,
  fails, times out, or yields nothing usable, a Postgres full-text search answers instead
  and ``source`` says ``"fallback"``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Final, Literal

import asyncpg

from memstream.agents_ctx.memory import policy, ranking
from memstream.agents_ctx.memory.outbox import (
    ENTRY_COLUMNS,
    NEXT_VERSION,
    append_events,
    entry_of_row,
    lock_agent,
    tombstone_of_row,
    upsert_entry,
)
from memstream.agents_ctx.memory.ports import IndexHit, MemoryIndexPort
from memstream.clock import Clock
from memstream.errors import InvalidRequest
from memstream.schemas.limits import PIN_MAX_ENTRIES, PIN_MIN_IMPORTANCE
from memstream.schemas.records import Caller, Category, MemoryEntry

if TYPE_CHECKING:
    from memstream.infra.metrics import Metrics

log = logging.getLogger(__name__)

INDEX_OVERFETCH: Final = 3
"""Ask the index for 3× the limit: some candidates may be stale and dropped by Postgres."""

INDEX_TIMEOUT_S: Final = 5.0
"""Default: an index slower than this is treated as down for this call (fallback)."""

# Visible, live entries of one agent: $1 account, $2 agent, $3 user (or NULL), $4 now.
_VISIBLE: Final = (
    "account_id = $1 AND agent_id = $2 AND (owner = '' OR owner = $3) "
    "AND (expires_at IS NULL OR expires_at > $4)"
)


@dataclass(frozen=True, slots=True)
class StoreResult:
    status: Literal["created", "unchanged", "replaced"]
    entry: MemoryEntry


@dataclass(frozen=True, slots=True)
class RecallResult:
    results: list[tuple[MemoryEntry, float]]
    source: Literal["index", "fallback"]


def keyword_query(text: str) -> str:
    """An OR of the query's words for ``to_tsquery``: any shared word is a match, more shared
    words rank higher. Only word characters reach Postgres, so no tsquery syntax errors."""
    words = re.findall(r"\w+", text.lower())
    return " | ".join(dict.fromkeys(words))


class MemoryService:
    """The memory tools over one Postgres pool; ``index`` is optional (recall falls back)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        clock: Clock,
        index: MemoryIndexPort | None = None,
        metrics: Metrics | None = None,
        index_timeout_s: float = INDEX_TIMEOUT_S,
    ) -> None:
        self._pool = pool
        self._index_timeout = index_timeout_s
        self._clock = clock
        self._index = index
        self._metrics = metrics

    # --- memory_store ---------------------------------------------------------------------
    async def store(
        self,
        caller: Caller,
        key: object,
        content: object,
        category: object,
        scope: object,
        importance: object = None,
    ) -> StoreResult:
        """Validate, screen and write one entry (see ``policy`` for every rule)."""
        req = policy.check_store(
            key=key,
            content=content,
            category=category,
            scope=scope,
            importance=importance,
            user_id=caller.user_id,
        )
        now = self._clock.now()
        async with self._pool.acquire() as conn, conn.transaction():
            await lock_agent(conn, caller.account_id, caller.agent_id)
            # the entry at this identity (locked) and the category's usage, in one round trip
            row = await conn.fetchrow(
                f"""
                SELECT u.agent_count, u.user_count, e.*
                FROM (SELECT count(*) AS agent_count,
                             count(*) FILTER (WHERE user_id = $5) AS user_count
                      FROM memory_entries
                      WHERE account_id = $1 AND agent_id = $2 AND category = $6
                        AND (expires_at IS NULL OR expires_at > $7)) AS u
                LEFT JOIN LATERAL (
                    SELECT {ENTRY_COLUMNS} FROM memory_entries
                    WHERE account_id = $1 AND agent_id = $2 AND owner = $3 AND key = $4
                    FOR UPDATE) AS e ON true
                """,
                caller.account_id,
                caller.agent_id,
                req.owner,
                req.key,
                caller.user_id,
                req.category,
                now,
            )
            assert row is not None
            existing = entry_of_row(row) if row["key"] is not None else None
            usage = policy.Usage(agent=int(row["agent_count"]), user=int(row["user_count"]))
            action = policy.decide_store(req, existing, usage, now)
            if action == "unchanged":
                assert existing is not None
                return StoreResult("unchanged", existing)
            if action == "replace":
                assert existing is not None
                entry = policy.replaced_entry(existing, req, now, version=0)
            else:
                entry = policy.new_entry(req, caller.account_id, caller.agent_id, now, version=0)
            written = await upsert_entry(conn, entry)
            await append_events(
                conn, "memory.replaced" if action == "replace" else "memory.stored", [written], now
            )
        return StoreResult("replaced" if action == "replace" else "created", written)

    # --- memory_forget --------------------------------------------------------------------
    async def forget(self, caller: Caller, key: object) -> bool:
        """Delete the entries under ``key`` the caller can see (the agent's shared one and
        the caller's private one). True if a live entry was forgotten. Others' private
        entries under the same key are untouched."""
        k = policy.validate_key(key)
        now = self._clock.now()
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                f"DELETE FROM memory_entries WHERE account_id = $1 AND agent_id = $2 "
                f"AND key = $3 AND (owner = '' OR owner = $4) "
                f"RETURNING {ENTRY_COLUMNS}, {NEXT_VERSION} AS tomb_version",
                caller.account_id,
                caller.agent_id,
                k,
                caller.user_id,
            )
            gone = [tombstone_of_row(r) for r in rows]
            await append_events(conn, "memory.forgotten", gone, now)
        return any(not policy.is_expired(e, now) for e in gone)

    # --- memory_recall --------------------------------------------------------------------
    async def recall(
        self,
        caller: Caller,
        query: object,
        limit: object = None,
        category: object = None,
    ) -> RecallResult:
        """The caller's best entries for ``query``, boosted by importance, at most ``limit``
        (default 5, capped at 20). Recall counters of the returned entries are updated."""
        if not isinstance(query, str) or not query.strip():
            raise InvalidRequest("query must be a non-empty string", field="query")
        n = ranking.resolve_limit(limit)
        cat = None if category is None else policy.validate_category(category)
        now = self._clock.now()
        started = time.perf_counter()
        hits = await self._index_hits(caller, query, n * INDEX_OVERFETCH, cat, now)
        source: Literal["index", "fallback"] = "index"
        scored = await self._fetch_hits(caller, hits, cat, now) if hits else []
        if not scored:
            source = "fallback"
            scored = await self._keyword(caller, query, n * INDEX_OVERFETCH, cat, now)
        top = ranking.rank(scored, n)
        touched = await self._mark_recalled(caller, [e for e, _ in top], now)
        if self._metrics is not None:
            self._metrics.recall_latency.labels(source=source).observe(
                time.perf_counter() - started
            )
        return RecallResult(
            results=[(touched.get((e.owner, e.key), e), s) for e, s in top], source=source
        )

    async def _index_hits(
        self, caller: Caller, query: str, limit: int, cat: Category | None, now: datetime
    ) -> list[IndexHit]:
        if self._index is None:
            return []
        try:
            return await asyncio.wait_for(
                self._index.query(
                    caller.account_id, caller.agent_id, caller.user_id, query, limit, cat, now
                ),
                self._index_timeout,
            )
        except Exception as e:  # any index failure means: answer from Postgres instead
            log.warning("memory index query failed, using keyword fallback: %r", e)
            return []

    async def _fetch_hits(
        self, caller: Caller, hits: list[IndexHit], cat: Category | None, now: datetime
    ) -> list[tuple[MemoryEntry, float]]:
        """Phase 2: the authoritative rows for the index's candidates, filtered again."""
        score: dict[tuple[str, str], float] = {}
        for ref, s in hits:
            score[ref] = max(s, score.get(ref, s))
        rows = await self._pool.fetch(
            f"SELECT {ENTRY_COLUMNS} FROM memory_entries WHERE {_VISIBLE} "
            "AND ($5::text IS NULL OR category = $5) "
            "AND (owner, key) IN (SELECT * FROM unnest($6::text[], $7::text[]))",
            caller.account_id,
            caller.agent_id,
            caller.user_id,
            now,
            cat,
            [ref[0] for ref, _ in hits],
            [ref[1] for ref, _ in hits],
        )
        entries = [entry_of_row(r) for r in rows]
        return [(e, score[(e.owner, e.key)]) for e in entries]

    async def _keyword(
        self, caller: Caller, query: str, limit: int, cat: Category | None, now: datetime
    ) -> list[tuple[MemoryEntry, float]]:
        q = keyword_query(query)
        if not q:
            return []
        rows = await self._pool.fetch(
            f"SELECT {ENTRY_COLUMNS}, ts_rank(search, tq) AS score "
            "FROM memory_entries, to_tsquery('english', $6) AS tq "
            f"WHERE {_VISIBLE} AND ($5::text IS NULL OR category = $5) AND search @@ tq "
            "ORDER BY score DESC, updated_at DESC LIMIT $7",
            caller.account_id,
            caller.agent_id,
            caller.user_id,
            now,
            cat,
            q,
            limit,
        )
        return [(entry_of_row(r), float(r["score"])) for r in rows]

    async def _mark_recalled(
        self, caller: Caller, entries: list[MemoryEntry], now: datetime
    ) -> dict[tuple[str, str], MemoryEntry]:
        if not entries:
            return {}
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                f"UPDATE memory_entries SET recall_count = recall_count + 1, "
                f"last_recalled_at = $3, version = {NEXT_VERSION} "
                "WHERE account_id = $1 AND agent_id = $2 "
                "AND (owner, key) IN (SELECT * FROM unnest($4::text[], $5::text[])) "
                f"RETURNING {ENTRY_COLUMNS}",
                caller.account_id,
                caller.agent_id,
                now,
                [e.owner for e in entries],
                [e.key for e in entries],
            )
            touched = [entry_of_row(r) for r in rows]
            await append_events(conn, "memory.recalled", touched, now)
        return {(e.owner, e.key): e for e in touched}

    # --- read side ------------------------------------------------------------------------
    async def pinned(self, caller: Caller, now: datetime | None = None) -> list[MemoryEntry]:
        """The pinned set (``pinning.pinned`` as one query): live, visible ``user_profile``
        entries of importance ≥ 0.7, by importance then recency, at most 10."""
        rows = await self._pool.fetch(
            f"SELECT {ENTRY_COLUMNS} FROM memory_entries WHERE {_VISIBLE} "
            "AND category = 'user_profile' AND importance >= $5 "
            "ORDER BY importance DESC, updated_at DESC, key LIMIT $6",
            caller.account_id,
            caller.agent_id,
            caller.user_id,
            now or self._clock.now(),
            PIN_MIN_IMPORTANCE,
            PIN_MAX_ENTRIES,
        )
        return [entry_of_row(r) for r in rows]

    async def list_visible(
        self, caller: Caller, category: Category | None = None, now: datetime | None = None
    ) -> list[MemoryEntry]:
        """Every live entry the caller can see, newest first (for the read side and tests)."""
        rows = await self._pool.fetch(
            f"SELECT {ENTRY_COLUMNS} FROM memory_entries WHERE {_VISIBLE} "
            "AND ($5::text IS NULL OR category = $5) ORDER BY updated_at DESC, key",
            caller.account_id,
            caller.agent_id,
            caller.user_id,
            now or self._clock.now(),
            category,
        )
        return [entry_of_row(r) for r in rows]

    async def count(self, account_id: str, agent_id: str) -> int:
        """How many live entries an agent holds (the spec's Overview count)."""
        n = await self._pool.fetchval(
            "SELECT count(*) FROM memory_entries WHERE account_id = $1 AND agent_id = $2 "
            "AND (expires_at IS NULL OR expires_at > $3)",
            account_id,
            agent_id,
            self._clock.now(),
        )
        return int(n)
