"""``Erasures``: erase a thread or a user from every place their content lived.

An erasure is a row in ``erasures`` (Postgres) that runs to completion in the background:

1. **Register** the threads in ``erased_threads`` first: from then on nothing re-creates
   them (consumers and replays drop events of registered threads; see
   ``docs/owning-memory.md``), and a resumed run knows which threads it had found. Their
   records are flagged deleted (metadata cleared) at once, so appends are refused while
   the erasure runs.
2. **Memory entries** (user erasure): the user's entries of every agent of the account are
   deleted in one transaction with ``memory.forgotten`` events whose entry carries no
   content (key and version only, so replaying the ``memory`` topic ends deleted); their
   Qdrant points and cached embeddings are deleted directly too; the user's earlier
   content-bearing outbox rows (pending, or kept after publishing) are deleted.
   **Data keys** (crypto-shredding, ``infra/data_keys.py``): the threads' keys and the
   user's key are destroyed, so every sealed copy on the Kafka topics is unreadable.
3. **Journal**: messages, tool calls and sequence-log envelopes (``Journal.erase_threads``).
4. **Summaries**: every summary object and every Redis key of each thread.
5. **ClickHouse**: the message rows, postings, vectors and owner rows of the threads, one
   mutation per table for all of them (``MessageStore.erase_threads``).

Where an engine's delete only marks a record, the step also takes the bytes off the local
files: the Postgres tables it deleted from are rewritten (``infra/postgres.vacuum``), the
journal's WAL files collected (``Journal.drop_erased_copies``), Valkey's append-only file
rewritten (``infra/redis_aof``), the lexical index purged and the text table compacted
(``MessageStore.erase_threads``), and the qdrant-edge shards that held the erased points
(memory entries, message vectors) rewritten from their live points (``ShardSlot.rewrite``);
what still lingers, and how long: docs/owning-memory.md.

Every step is idempotent, so an erasure interrupted anywhere (a crash, a failing store) is
resumed by running it again from the start: ``resume()`` does that for every erasure still
``running`` (called at start-up). ``stores`` counts what each store removed, summed over
runs. Status is ``done`` only once every step of every thread succeeded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal

import asyncpg

from memstream.agents_ctx.memory.outbox import (
    ENTRY_COLUMNS,
    NEXT_VERSION,
    append_events,
    tombstone_of_row,
)
from memstream.errors import InfraError, NotFound
from memstream.infra.data_keys import thread_scope, user_scope
from memstream.infra.postgres import vacuum
from memstream.schemas.records import JSONObject, MemoryEntry, ThreadRef

if TYPE_CHECKING:
    from memstream.agents_ctx.services import Services

log = logging.getLogger(__name__)

PROGRESS_EVERY_S: Final = 0.5
"""How often a long step adds to the erasure's per-store counts (one Postgres transaction
each: per thread, they were a fifth of a 1,000-thread erasure)."""

Kind = Literal["thread", "user"]

STORES = (
    "postgres_entries",
    "postgres_outbox",
    "data_keys",
    "qdrant",
    "embedding_cache",
    "journal_messages",
    "journal_tool_calls",
    "journal_sequence",
    "summaries",
    "redis",
    "clickhouse",
    "postgres_threads",
)


@dataclass(frozen=True, slots=True)
class Erasure:
    erasure_id: str
    account_id: str
    kind: Kind
    agent_id: str | None
    thread_id: str | None
    user_id: str | None
    status: str
    stores: dict[str, int]
    step: str | None = None

    def to_dict(self) -> JSONObject:
        return {
            "erasure_id": self.erasure_id,
            "kind": self.kind,
            "status": self.status,
            "step": self.step,
            "stores": dict(self.stores),
        }


def _erasure(row: Mapping[str, object]) -> Erasure:
    stores = row["stores"]
    return Erasure(
        erasure_id=str(row["erasure_id"]),
        account_id=str(row["account_id"]),
        kind="thread" if row["kind"] == "thread" else "user",
        agent_id=None if row["agent_id"] is None else str(row["agent_id"]),
        thread_id=None if row["thread_id"] is None else str(row["thread_id"]),
        user_id=None if row["user_id"] is None else str(row["user_id"]),
        status=str(row["status"]),
        stores={str(k): int(v) for k, v in stores.items()} if isinstance(stores, dict) else {},
        step=None if row.get("step") is None else str(row["step"]),
    )


def redacted(entry: MemoryEntry) -> MemoryEntry:
    """What an erased entry's ``memory.forgotten`` event carries: identity and version only."""
    return entry.with_changes(content="", content_hash="")


class Erasures:
    """Start, run, resume and report erasures (one per process, on ``Services``)."""

    def __init__(self, services: Services, *, rewrite_tables: bool = True) -> None:
        self._svc = services
        #: VACUUM FULL instead of VACUUM after the deletes (``erasure_rewrite_tables``)
        self.rewrite_tables = rewrite_tables
        self._pool: asyncpg.Pool = services.accounts.pool
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._running: dict[str, asyncio.Lock] = {}

    # --- starting -------------------------------------------------------------------------
    async def erase_thread(self, ref: ThreadRef) -> str:
        return await self._start(ref.account_id, "thread", ref.agent_id, ref.thread_id, None)

    async def erase_user(self, account_id: str, user_id: str) -> str:
        return await self._start(account_id, "user", None, None, user_id)

    async def _start(
        self,
        account_id: str,
        kind: Kind,
        agent_id: str | None,
        thread_id: str | None,
        user_id: str | None,
    ) -> str:
        """A running erasure of the same target is reused (idempotent POST)."""
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                f"erase/{account_id}/{kind}/{agent_id}/{thread_id}/{user_id}",
            )
            existing = await conn.fetchval(
                "SELECT erasure_id FROM erasures WHERE account_id = $1 AND kind = $2 "
                "AND agent_id IS NOT DISTINCT FROM $3 AND thread_id IS NOT DISTINCT FROM $4 "
                "AND user_id IS NOT DISTINCT FROM $5 AND status = 'running'",
                account_id,
                kind,
                agent_id,
                thread_id,
                user_id,
            )
            erasure_id = str(existing) if existing else "era_" + secrets.token_hex(12)
            if not existing:
                await conn.execute(
                    "INSERT INTO erasures (erasure_id, account_id, kind, agent_id, thread_id, "
                    "user_id) VALUES ($1, $2, $3, $4, $5, $6)",
                    erasure_id,
                    account_id,
                    kind,
                    agent_id,
                    thread_id,
                    user_id,
                )
        self._spawn(erasure_id)
        return erasure_id

    def _spawn(self, erasure_id: str) -> None:
        task = self._tasks.get(erasure_id)
        if task is not None and not task.done():
            return
        self._tasks[erasure_id] = asyncio.create_task(
            self._run_logged(erasure_id), name=f"erasure-{erasure_id}"
        )

    async def _run_logged(self, erasure_id: str) -> None:
        try:
            await self.run(erasure_id)
        except Exception as e:  # stays 'running'; resume() retries it
            log.warning("erasure %s stopped before done (will resume): %r", erasure_id, e)

    async def resume(self) -> list[str]:
        """Restart every erasure still running (after a crash); returns their ids."""
        ids = [
            str(r["erasure_id"])
            for r in await self._pool.fetch(
                "SELECT erasure_id FROM erasures WHERE status = 'running' ORDER BY created_at"
            )
        ]
        for erasure_id in ids:
            self._spawn(erasure_id)
        return ids

    async def wait(self, erasure_id: str) -> None:
        """Wait for this process's run of an erasure (tests, CLI)."""
        task = self._tasks.get(erasure_id)
        if task is not None:
            await asyncio.shield(task)

    async def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        for task in self._tasks.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task  # a cancelled run stays 'running' and resumes at next start

    # --- status ---------------------------------------------------------------------------
    async def get(self, account_id: str, erasure_id: str) -> Erasure:
        row = await self._pool.fetchrow(
            "SELECT * FROM erasures WHERE erasure_id = $1 AND account_id = $2",
            erasure_id,
            account_id,
        )
        if row is None:
            raise NotFound(f"no erasure {erasure_id!r}", field="erasure_id")
        return _erasure(row)

    # --- running --------------------------------------------------------------------------
    async def run(self, erasure_id: str) -> Erasure:
        """Run (or re-run) one erasure to completion; raises if a store fails (the erasure
        stays running, and running it again resumes it). Runs of one erasure in this
        process take turns."""
        async with self._running.setdefault(erasure_id, asyncio.Lock()):
            return await self._run(erasure_id)

    async def _run(self, erasure_id: str) -> Erasure:
        row = await self._pool.fetchrow("SELECT * FROM erasures WHERE erasure_id = $1", erasure_id)
        if row is None:
            raise NotFound(f"no erasure {erasure_id!r}", field="erasure_id")
        e = _erasure(row)
        if e.status == "done":
            return e
        # counts exist once a run got past registering: an earlier run may have deleted
        # from an index and stopped before purging it, and a delete found nothing this time
        resumed = bool(e.stores)
        try:
            async with self._step(e, "register"):
                refs = await self._register(e)
            if e.kind == "user" and e.user_id is not None:
                async with self._step(e, "entries"):
                    await self._erase_entries(e, e.user_id, resumed=resumed)
            async with self._step(e, "keys"):
                await self._shred(e, refs)
            async with self._step(e, "threads"):
                await self._erase_threads(e, refs, resumed=resumed)
            await self._pool.execute(
                "UPDATE erasures SET status = 'done', step = NULL, finished_at = now() "
                "WHERE erasure_id = $1",
                erasure_id,
            )
        except Exception:
            self._outcome(e.kind, "failed")
            raise
        self._outcome(e.kind, "done")
        return await self.get(e.account_id, erasure_id)

    @contextlib.asynccontextmanager
    async def _step(self, e: Erasure, name: str) -> AsyncIterator[None]:
        """One step: shown as the erasure's ``step`` and timed into
        ``memstream_erasure_step_seconds`` (when metrics are wired)."""
        await self._doing(e, name)
        start = time.perf_counter()
        try:
            yield
        finally:
            if self._svc.metrics is not None:
                self._svc.metrics.erasure_step_latency.labels(name).observe(
                    time.perf_counter() - start
                )

    async def _doing(self, e: Erasure, step: str) -> None:
        """What the erasure does now (``GET /v1/erasures/{id}``'s ``step``): a step, or a
        long part of one (an index rewritten). Left as it is when a run fails: where it
        stopped."""
        await self._pool.execute(
            "UPDATE erasures SET step = $2 WHERE erasure_id = $1", e.erasure_id, step
        )

    def _outcome(self, kind: str, outcome: str) -> None:
        if self._svc.metrics is not None:
            self._svc.metrics.erasures.labels(kind, outcome).inc()

    async def _register(self, e: Erasure) -> list[ThreadRef]:
        """The erasure's threads, registered as erased (before anything is deleted)."""
        found: list[ThreadRef] = []
        if e.kind == "thread" and e.agent_id is not None and e.thread_id is not None:
            found.append(ThreadRef(e.account_id, e.agent_id, e.thread_id))
        elif e.user_id is not None:
            # the threads they opened (Postgres, the authority) and the ones they wrote in
            # (the projection's owners: shared threads too)
            for r in await self._pool.fetch(
                "SELECT agent_id, thread_id FROM threads WHERE account_id = $1 AND owner_user = $2",
                e.account_id,
                e.user_id,
            ):
                found.append(ThreadRef(e.account_id, r["agent_id"], r["thread_id"]))
            store = self._svc.message_store
            if store is not None:
                for agent_id, thread_id in await store.threads_of_user(e.account_id, e.user_id):
                    found.append(ThreadRef(e.account_id, agent_id, thread_id))
        await self._pool.execute(
            "INSERT INTO erased_threads (account_id, agent_id, thread_id, erasure_id) "
            "SELECT $1, g, t, $4 FROM unnest($2::text[], $3::text[]) AS u(g, t) "
            "ON CONFLICT DO NOTHING",
            e.account_id,
            [r.agent_id for r in found],
            [r.thread_id for r in found],
            e.erasure_id,
        )
        rows = await self._pool.fetch(
            "SELECT agent_id, thread_id FROM erased_threads WHERE erasure_id = $1 "
            "ORDER BY agent_id, thread_id",
            e.erasure_id,
        )
        refs = [ThreadRef(e.account_id, r["agent_id"], r["thread_id"]) for r in rows]
        if self._svc.message_store is not None:  # the projection drops them from now on
            self._svc.message_store.erased.add(refs)
        # the records are flagged deleted before the journal is touched, so appends to the
        # threads are refused (404) while the erasure runs and none lands after its scan
        status = await self._pool.execute(
            "UPDATE threads SET deleted = true, metadata = '{}'::jsonb, updated_at = now() "
            "FROM unnest($2::text[], $3::text[]) AS u(g, t) WHERE account_id = $1 "
            "AND agent_id = u.g AND thread_id = u.t AND (NOT deleted OR metadata <> '{}'::jsonb)",
            e.account_id,
            [r.agent_id for r in refs],
            [r.thread_id for r in refs],
        )
        # an UPDATE leaves the old row version, metadata and all, in the heap until a vacuum
        await self._vacuum("threads")
        for ref in refs:
            self._svc.threads.forget(ref)
        await self._count(e.erasure_id, {"postgres_threads": int(str(status).split()[-1])})
        return refs

    async def _vacuum(self, *tables: str) -> None:
        """:func:`~memstream.infra.postgres.vacuum` of ``tables`` after a delete: with
        :attr:`rewrite_tables` the erased bytes leave their files too."""
        await vacuum(self._pool, *tables, rewrite=self.rewrite_tables)

    async def _count(self, erasure_id: str, counts: Mapping[str, int]) -> None:
        """Add to the erasure's per-store counts (progress, visible while running)."""
        async with self._pool.acquire() as conn, conn.transaction():
            current = await conn.fetchval(
                "SELECT stores FROM erasures WHERE erasure_id = $1 FOR UPDATE", erasure_id
            )
            total: Counter[str] = Counter(current if isinstance(current, dict) else {})
            total.update({k: int(v) for k, v in counts.items()})
            await conn.execute(
                "UPDATE erasures SET stores = $2 WHERE erasure_id = $1", erasure_id, dict(total)
            )

    async def _erase_entries(self, e: Erasure, user_id: str, *, resumed: bool) -> None:
        now = self._svc.clock.now()
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                f"DELETE FROM memory_entries WHERE account_id = $1 AND user_id = $2 "
                f"RETURNING {ENTRY_COLUMNS}, {NEXT_VERSION} AS tomb_version",
                e.account_id,
                user_id,
            )
            last = [tombstone_of_row(r) for r in rows]
            gone = [redacted(t) for t in last]
            await append_events(conn, "memory.forgotten", gone, now)
            # their earlier events in the outbox (pending, or kept a day after publishing)
            outbox = await conn.execute(
                "DELETE FROM memory_outbox WHERE account_id = $1 AND "
                "convert_from(event, 'UTF8')::jsonb #>> '{data,entry,user_id}' = $2 AND "
                "coalesce(convert_from(event, 'UTF8')::jsonb #>> '{data,entry,content}', '') "
                "<> ''",
                e.account_id,
                user_id,
            )
            # the index never re-applies these states (the topic still has them)
            await conn.execute(
                "INSERT INTO erased_entries (account_id, agent_id, owner, key, version, "
                "erasure_id) SELECT $1, g, o, k, v, $6 FROM unnest($2::text[], $3::text[], "
                "$4::text[], $5::bigint[]) AS u(g, o, k, v) ON CONFLICT "
                "(account_id, agent_id, owner, key) DO UPDATE SET version = "
                "greatest(erased_entries.version, EXCLUDED.version)",
                e.account_id,
                [t.agent_id for t in gone],
                [t.owner for t in gone],
                [t.key for t in gone],
                [t.version for t in gone],
                e.erasure_id,
            )
        counts: Counter[str] = Counter(
            postgres_entries=len(gone), postgres_outbox=int(str(outbox).split()[-1])
        )
        # the deleted rows (the entries' content, the outbox's events) leave the heap
        await self._vacuum("memory_outbox", "memory_entries")
        index = self._svc.memory_index
        if index is not None and last:  # the last states: their texts key the embedding cache
            for t in gone:
                index.erased.add((t.account_id, t.agent_id, t.owner, t.key), t.version)
            points, cached = await index.erase(last)
            counts.update(qdrant=points, embedding_cache=cached)
        # a delete marks the points: the collection is rewritten without them
        if index is not None and (last or resumed):
            await self._doing(e, "entries: rewriting the memory index")
            await index.purge(e.account_id)
        await self._count(e.erasure_id, counts)

    async def _shred(self, e: Erasure, refs: list[ThreadRef]) -> None:
        """Destroy the data keys of the threads (and of the user): every sealed copy on the
        Kafka topics (journal, summaries, memory, dead letters) becomes unreadable."""
        keyring = self._svc.keyring
        if keyring is None:
            return
        scopes = [thread_scope(r.account_id, r.agent_id, r.thread_id) for r in refs]
        if e.kind == "user" and e.user_id is not None:
            scopes.append(user_scope(e.account_id, e.user_id))
        destroyed = await keyring.destroy(scopes, rewrite=self.rewrite_tables)
        await self._count(e.erasure_id, {"data_keys": destroyed})

    async def _erase_threads(self, e: Erasure, refs: list[ThreadRef], *, resumed: bool) -> None:
        if not refs:
            return
        journal = self._svc.journal
        if journal is None:
            raise InfraError("the journal writer is not in this process; erasure cannot run here")
        await self._doing(e, "threads: journal")
        erased = await journal.erase_threads(refs)
        await journal.drop_erased_copies()  # the WAL files that held them
        await self._count(
            e.erasure_id,
            {
                "journal_messages": erased.messages,
                "journal_tool_calls": erased.tool_calls,
                "journal_sequence": erased.sequence,
            },
        )
        summaries = self._svc.summary_store
        if summaries is not None:
            await self._doing(e, "threads: summaries")
            done, shown = 0, time.monotonic()
            for ref in refs:  # progress recorded every PROGRESS_EVERY_S, not per thread
                done += await summaries.erase_objects(ref)
                if time.monotonic() - shown >= PROGRESS_EVERY_S:
                    await self._count(e.erasure_id, {"summaries": done})
                    done, shown = 0, time.monotonic()
            await self._count(e.erasure_id, {"summaries": done})
            await self._count(e.erasure_id, {"redis": await summaries.erase_keys(refs)})
            if refs:  # the deleted keys' writes stay in Valkey's AOF until it is rewritten
                await summaries.rewrite_log()
        if self._svc.message_store is not None:  # all threads in one mutation per table
            await self._doing(e, "threads: transcript (ClickHouse, then its indexes rewritten)")
            rows = await self._svc.message_store.erase_threads(
                [(r.account_id, r.agent_id, r.thread_id) for r in refs], purge=resumed
            )
            await self._count(e.erasure_id, {"clickhouse": rows})


async def erased_threads(pool: asyncpg.Pool, account_id: str) -> set[tuple[str, str]]:
    """(agent, thread) of every erased thread of an account (for guards and tests)."""
    rows = await pool.fetch(
        "SELECT agent_id, thread_id FROM erased_threads WHERE account_id = $1", account_id
    )
    return {(r["agent_id"], r["thread_id"]) for r in rows}
