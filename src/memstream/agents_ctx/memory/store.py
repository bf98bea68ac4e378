"""``MemoryService``: the three memory tools (store, recall, forget) and the pinned-set query,
over Postgres (authoritative) and an optional semantic index.

Guarantees:

- **Atomic**: every change to an entry and its ``memory.*`` outbox event are written in one
  transaction; a rejected call writes nothing.
- **Capacity holds under concurrency**: a store that needs room writes its entry and outbox
  row first, then takes the (account, agent, category) advisory lock, counts the category
  (its own row excluded) and commits; the lock covers only the count and the commit, so
  concurrent stores of one agent overlap in everything else (stores of different categories
  in everything), and every count still sees every
  committed entry (``outbox.capacity_usage``). Stores of one key are serialised by its row lock.
- **Isolation**: every statement filters by account and agent; a caller sees the agent's
  shared entries plus its own private ones, nothing else (also in forget and recall).
- **Recall never trusts the index**: candidates from the index are re-fetched from Postgres
  with visibility, expiry and the category filter applied again. If the index is missing,
  fails, times out, or yields nothing usable, a Postgres full-text search answers instead
  and ``source`` says ``"fallback"``.
- **Recall's Postgres cost does not depend on planner statistics**: the candidates are
  fetched by one primary-key seek each (see ``_FETCH_BY_REFS``), and the recall counters are
  bumped, with their ``memory.recalled`` outbox rows, in one statement (one round trip, its
  own transaction) that only touches rows unchanged since that fetch; an entry changed in
  between (a concurrent recall, store or forget) goes through the locking path instead, so
  no bump is ever lost or applied to a newer version.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Final, Literal, cast

import asyncpg

from memstream.agents_ctx.access import MemoryBinding, require_memory
from memstream.agents_ctx.memory import policy, ranking
from memstream.agents_ctx.memory.batch_store import Split, identity, store_group
from memstream.agents_ctx.memory.bounded import PgWaits
from memstream.agents_ctx.memory.entries import MemoryEntries
from memstream.agents_ctx.memory.group_commit import GroupCommit
from memstream.agents_ctx.memory.outbox import (
    ENTRY_COLUMNS,
    NEXT_VERSION,
    OUTBOX_CHANNEL,
    append_events,
    capacity_usage,
    entry_of_row,
    tombstone_of_row,
    write_entry_if,
)
from memstream.agents_ctx.memory.ports import IndexHit, MemoryIndexPort
from memstream.agents_ctx.memory.semantic_screen import SemanticScreen
from memstream.clock import Clock, epoch_ms
from memstream.errors import Conflict, InvalidRequest, PromptInjection, RetryableInfraError
from memstream.infra.accounts import Accounts
from memstream.schemas.events import encode, memory_event
from memstream.schemas.limits import MAX_QUERY_CHARS, PIN_MAX_ENTRIES, PIN_MIN_IMPORTANCE
from memstream.schemas.records import Caller, Category, MemoryEntry

if TYPE_CHECKING:
    from memstream.infra.metrics import Metrics

log = logging.getLogger(__name__)

INDEX_OVERFETCH: Final = 3
"""Ask the index for 3× the limit: some candidates may be stale and dropped by Postgres."""

INDEX_TIMEOUT_S: Final = 5.0
"""Default: an index slower than this is treated as down for this call (fallback)."""

_STORE_ATTEMPTS: Final = 8
"""Reads of an absent key before a store gives up (``Conflict``): each retry means another
store created the key in between and committed, after which the row lock serialises."""

_GROUP_ATTEMPTS: Final = 3
"""Transactions a group may try (each without the calls the previous one set apart) before
the calls left run one by one."""

_ONE_BY_ONE: Final = (
    asyncpg.TransactionRollbackError,  # a deadlock or serialization failure between groups
    asyncpg.DataError,
    asyncpg.IntegrityConstraintViolationError,
)
"""Errors of a group's transaction after which its calls are run one by one (whichever call
caused it then gets it alone); any other error is every call's."""

# Visible, live entries of one agent: $1 account, $2 agent, $3 user (or NULL), $4 now.
_VISIBLE: Final = (
    "account_id = $1 AND agent_id = $2 AND (owner = '' OR owner = $3) "
    "AND (expires_at IS NULL OR expires_at > $4)"
)


# Phase 2 of recall. One seek per candidate on the primary key (account, agent, owner, key):
# "the first row at or after the candidate's key, in key order", then checked for equality
# and filtered. A row comparison with ORDER BY … LIMIT 1 can only be served by the primary
# key, so the plan holds whatever the statistics say (a freshly loaded table has none, and
# the planner then prefers any (account, agent) index and scans every entry of the agent:
# ≈25 ms at 10k entries instead of ≈0.5 ms). Each row also takes the version its recall
# bump would get (a sequence value; the unused ones are gaps, which versions allow) and
# its ctid, so the bump can be written in one statement.
# $1 account, $2 agent, $3 user (or NULL), $4 now, $5 category (or NULL), $6/$7 owners/keys.
_FETCH_BY_REFS: Final = f"""
SELECT e.*, {NEXT_VERSION} AS recall_version
FROM unnest($6::text[], $7::text[]) AS u(owner, key)
CROSS JOIN LATERAL (
    SELECT ctid AS row_tid, {ENTRY_COLUMNS} FROM memory_entries
    WHERE (account_id, agent_id, owner, key) >= ($1, $2, u.owner, u.key)
    ORDER BY account_id, agent_id, owner, key
    LIMIT 1) AS e
WHERE e.account_id = $1 AND e.agent_id = $2 AND e.owner = u.owner AND e.key = u.key
  AND (e.owner = '' OR e.owner = $3) AND (e.expires_at IS NULL OR e.expires_at > $4)
  AND ($5::text IS NULL OR e.category = $5)
"""

# The recall bump of rows still as fetched (same ctid, same version), and their outbox rows,
# in one statement: atomic on its own, one round trip. The events are encoded beforehand
# from the fetched rows (recall_count + 1, last_recalled_at, the pre-taken version), which
# is exactly what the row becomes, since it has not changed. Rows that did change are not
# returned; the caller bumps those with the locking path. The rows are found by ctid (a TID
# scan, whatever the statistics) and identified by their version: every write takes a fresh
# value of one global sequence, so (ctid, version) is the fetched row or nothing. No account
# or agent predicate on purpose: the planner would then scan the agent's rows by index.
# $1 tids, $2 fetched versions, $3 new versions, $4 event ids, $5 events, $6 now,
# $7 account, $8 agent, $9 the relay's NOTIFY channel.
_BUMP_UNCHANGED: Final = """
WITH u AS (
    SELECT * FROM unnest($1::tid[], $2::bigint[], $3::bigint[], $4::text[], $5::bytea[])
        AS u(tid, old_version, new_version, event_id, event)
), bumped AS (
    UPDATE memory_entries AS m
    SET recall_count = m.recall_count + 1, last_recalled_at = $6, version = u.new_version
    FROM u
    WHERE m.ctid = ANY($1::tid[]) AND m.ctid = u.tid AND m.version = u.old_version
    RETURNING m.owner, m.key, u.new_version
), events AS (
    INSERT INTO memory_outbox (account_id, agent_id, event_id, event)
    SELECT $7, $8, u.event_id, u.event
    FROM u JOIN bumped ON bumped.new_version = u.new_version, (SELECT pg_notify($9, '')) AS wake
    ORDER BY u.new_version
)
SELECT owner, key FROM bumped
"""


@dataclass(frozen=True, slots=True)
class _Fetched:
    """Where a fetched row was, and the version its recall bump takes."""

    tid: tuple[int, int]
    recall_version: int


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
        binding: MemoryBinding | None = None,
        semantic_screen: SemanticScreen | None = None,
        pg_waits: PgWaits | None = None,
        group_commit: bool = True,
    ) -> None:
        """``group_commit``: concurrent stores of one account share transactions
        (``GroupCommit``); False runs every store in its own."""
        self._pool = pool
        # the second injection screen, after the patterns (None: patterns only)
        self._semantic = semantic_screen
        # the Memory binding is read through this (pass the surfaces' ``Accounts`` so that
        # a PUT /v1/agents/{id} through them is seen at once)
        self._binding: MemoryBinding = binding if binding is not None else Accounts(pool)
        self._index_timeout = index_timeout_s
        self._clock = clock
        self._index = index
        self._metrics = metrics
        self.entries = MemoryEntries(pool, clock, self._binding, pg_waits, semantic_screen)
        """Browse, edit, export and import (the entries routes)."""
        self._group: GroupCommit[tuple[Caller, policy.StoreRequest], StoreResult] | None = (
            GroupCommit(self._store_group, lambda call: identity(*call)) if group_commit else None
        )

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
        """Validate, screen and write one entry (see ``policy`` for every rule).
        ``MemoryNotBound`` (nothing written) on an agent without Memory bound."""
        await require_memory(self._binding, caller)
        req = policy.check_store(
            key=key,
            content=content,
            category=category,
            scope=scope,
            importance=importance,
            user_id=caller.user_id,
        )
        if self._semantic is not None and await self._semantic.is_injection(req.content):
            raise PromptInjection(
                "content resembles a prompt injection (semantic screen)", field="content"
            )
        if self._group is None:
            return await self._store_one(caller, req)
        return await self._group.submit(caller.account_id, (caller, req))

    async def _store_group(
        self, calls: Sequence[tuple[Caller, policy.StoreRequest]]
    ) -> list[StoreResult | Exception]:
        """One group of concurrent stores of one account (``GroupCommit``): alone, the store
        of one call; otherwise one transaction (``batch_store.store_group``), tried again
        without the calls it sets apart (``Split``), which run each on its own, in arrival
        order, like the whole group when it keeps failing."""
        out: list[StoreResult | Exception | None] = [None] * len(calls)
        group = list(range(len(calls)))
        alone: list[int] = []
        for _ in range(_GROUP_ATTEMPTS):
            if len(group) < 2:
                break
            try:
                async with self._pool.acquire() as conn:
                    done = await store_group(conn, [calls[i] for i in group], self._clock.now())
            except _ONE_BY_ONE as e:  # nothing written; each call may still be fine alone
                log.info("group of %d stores rolled back (%r): one by one", len(group), e)
                break
            if isinstance(done, Split):
                log.debug(
                    "group of %d stores rolled back, %d set apart", len(group), len(done.alone)
                )
                alone += [group[j] for j in done.alone]
                group = [i for j, i in enumerate(group) if j not in done.alone]
                continue
            for i, (status, entry) in zip(group, done, strict=True):
                out[i] = StoreResult(status, entry)
            group = []
        rest = sorted(alone + group)
        for n, i in enumerate(rest):
            try:
                out[i] = await self._store_one(*calls[i])
            except RetryableInfraError as e:  # Postgres is busy or away: the rest would wait too
                for j in rest[n:]:
                    out[j] = e
                break
            except Exception as e:  # this call's own outcome, not the group's
                out[i] = e
        assert all(o is not None for o in out)
        return cast(list[StoreResult | Exception], out)

    async def _store_one(self, caller: Caller, req: policy.StoreRequest) -> StoreResult:
        """One checked store in its own transaction (see the module docstring)."""
        now = self._clock.now()
        async with self._pool.acquire() as conn, conn.transaction():
            for _ in range(_STORE_ATTEMPTS):
                row = await conn.fetchrow(
                    f"SELECT {ENTRY_COLUMNS} FROM memory_entries WHERE account_id = $1 "
                    "AND agent_id = $2 AND owner = $3 AND key = $4 FOR UPDATE",
                    caller.account_id,
                    caller.agent_id,
                    req.owner,
                    req.key,
                )
                existing = None if row is None else entry_of_row(row)
                action, needs_room = policy.plan_store(req, existing, now)
                if action == "unchanged":
                    assert existing is not None
                    return StoreResult("unchanged", existing)
                if action == "replace":
                    assert existing is not None
                    entry = policy.replaced_entry(existing, req, now, version=0)
                else:
                    entry = policy.new_entry(
                        req, caller.account_id, caller.agent_id, now, version=0
                    )
                found = None if existing is None else existing.version
                written = await write_entry_if(conn, entry, found)
                if written is not None:
                    break
                # another store created this key between the read and the write: read again
            else:
                raise Conflict(
                    f"memory entry {req.key!r} keeps changing under concurrent writes; retry",
                    field="key",
                )
            await append_events(
                conn, "memory.replaced" if action == "replace" else "memory.stored", [written], now
            )
            if needs_room:
                # the serialised part: the count (which sees every committed entry) and the
                # commit; a refusal rolls the write and its event back
                usage = await capacity_usage(conn, written, now, without_itself=True)
                policy.check_capacity(req.category, req.user_id, usage)
        return StoreResult("replaced" if action == "replace" else "created", written)

    # --- memory_forget --------------------------------------------------------------------
    async def forget(self, caller: Caller, key: object) -> bool:
        """Delete the entries under ``key`` the caller can see (the agent's shared one and
        the caller's private one). True if a live entry was forgotten. Others' private
        entries under the same key are untouched."""
        await require_memory(self._binding, caller)
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
        (default 5, capped at 20). Recall counters of the returned entries are updated.
        ``MemoryNotBound`` on an agent without Memory bound; ``InvalidRequest`` (``query``) on
        a query longer than ``MAX_QUERY_CHARS`` (journal search's bound): embedding it is
        the index's cost, and a query is a question, not a document."""
        await require_memory(self._binding, caller)
        if not isinstance(query, str) or not query.strip():
            raise InvalidRequest("query must be a non-empty string", field="query")
        if len(query) > MAX_QUERY_CHARS:
            raise InvalidRequest(
                f"query must be at most {MAX_QUERY_CHARS} characters", field="query"
            )
        n = ranking.resolve_limit(limit)
        cat = None if category is None else policy.validate_category(category)
        now = self._clock.now()
        started = time.perf_counter()
        hits = await self._index_hits(caller, query, n * INDEX_OVERFETCH, cat, now)
        source: Literal["index", "fallback"] = "index"
        fetched: dict[tuple[str, str], _Fetched] = {}
        # one connection for the reads and the bump: the pool's reset query runs once
        async with self._pool.acquire() as conn:
            scored = await self._fetch_hits(caller, hits, cat, now, fetched, conn) if hits else []
            if not scored:
                source = "fallback"
                scored = await self._keyword(caller, query, n * INDEX_OVERFETCH, cat, now, conn)
            top = ranking.rank(scored, n)
            touched = await self._mark_recalled(caller, [e for e, _ in top], now, fetched, conn)
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
        self,
        caller: Caller,
        hits: list[IndexHit],
        cat: Category | None,
        now: datetime,
        fetched: dict[tuple[str, str], _Fetched] | None = None,
        conn: asyncpg.Connection | None = None,
    ) -> list[tuple[MemoryEntry, float]]:
        """Phase 2: the authoritative rows for the index's candidates, filtered again
        (``fetched`` receives where each row was, for :meth:`_mark_recalled`)."""
        score: dict[tuple[str, str], float] = {}
        for ref, s in hits:
            score[ref] = max(s, score.get(ref, s))
        rows = await (conn or self._pool).fetch(
            _FETCH_BY_REFS,
            caller.account_id,
            caller.agent_id,
            caller.user_id,
            now,
            cat,
            [ref[0] for ref in score],
            [ref[1] for ref in score],
        )
        out: list[tuple[MemoryEntry, float]] = []
        for r in rows:
            e = entry_of_row(r)
            out.append((e, score[(e.owner, e.key)]))
            if fetched is not None:
                fetched[(e.owner, e.key)] = _Fetched(tuple(r["row_tid"]), int(r["recall_version"]))
        return out

    async def _keyword(
        self,
        caller: Caller,
        query: str,
        limit: int,
        cat: Category | None,
        now: datetime,
        conn: asyncpg.Connection | None = None,
    ) -> list[tuple[MemoryEntry, float]]:
        q = keyword_query(query)
        if not q:
            return []
        rows = await (conn or self._pool).fetch(
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
        self,
        caller: Caller,
        entries: list[MemoryEntry],
        now: datetime,
        fetched: dict[tuple[str, str], _Fetched] | None = None,
        conn: asyncpg.Connection | None = None,
    ) -> dict[tuple[str, str], MemoryEntry]:
        """Bump the recall counters of ``entries`` (with one ``memory.recalled`` event
        each); returns the rows as written. Rows unchanged since ``fetched`` take the
        one-statement path, the others (or all, without ``fetched``) the locking one."""
        touched: dict[tuple[str, str], MemoryEntry] = {}
        rest = entries
        if fetched:
            fast = [e for e in entries if (e.owner, e.key) in fetched]
            rest = [e for e in entries if (e.owner, e.key) not in fetched]
            if fast:
                done = await self._bump_unchanged(caller, fast, now, fetched, conn)
                touched.update(done)
                rest += [e for e in fast if (e.owner, e.key) not in done]
        if rest:
            touched.update(await self._bump_locking(caller, rest, now, conn))
        return touched

    async def _bump_unchanged(
        self,
        caller: Caller,
        entries: list[MemoryEntry],
        now: datetime,
        fetched: dict[tuple[str, str], _Fetched],
        conn: asyncpg.Connection | None = None,
    ) -> dict[tuple[str, str], MemoryEntry]:
        ts = epoch_ms(now)
        after = [
            e.with_changes(
                recall_count=e.recall_count + 1,
                last_recalled_at=now,
                version=fetched[(e.owner, e.key)].recall_version,
            )
            for e in entries
        ]
        envs = [memory_event("memory.recalled", e, ts) for e in after]
        rows = await (conn or self._pool).fetch(
            _BUMP_UNCHANGED,
            [fetched[(e.owner, e.key)].tid for e in entries],
            [e.version for e in entries],
            [e.version for e in after],
            [env.id for env in envs],
            [encode(env) for env in envs],
            now,
            caller.account_id,
            caller.agent_id,
            OUTBOX_CHANNEL,
        )
        done = {(r["owner"], r["key"]) for r in rows}
        return {(e.owner, e.key): e for e in after if (e.owner, e.key) in done}

    async def _bump_locking(
        self,
        caller: Caller,
        entries: list[MemoryEntry],
        now: datetime,
        conn: asyncpg.Connection | None = None,
    ) -> dict[tuple[str, str], MemoryEntry]:
        async with contextlib.AsyncExitStack() as stack:
            c: asyncpg.Connection = (
                conn if conn is not None else await stack.enter_async_context(self._pool.acquire())
            )
            await stack.enter_async_context(c.transaction())
            rows = await c.fetch(
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
            await append_events(c, "memory.recalled", touched, now)
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
