"""The message projection over any :class:`ClickHouseEngine`: schema, batch writes, search.

Guarantees:

- :meth:`MessageStore.write` returns only after both inserts are committed, and writes the
  ``thread_users`` rows *before* the messages they cover: a message is never searchable
  while its thread's privacy is still unknown.
- Writing the same rows twice (a replay, a redelivery) leaves search results unchanged: the
  search query returns one row per (thread, offset) and the tables collapse duplicates on
  merge.
- :meth:`MessageStore.write_journal_batch` projects raw journal records in bulk (pyarrow's
  C++ JSON reader and compute kernels, :mod:`~memstream.projections.messages.arrow_batch`;
  or ClickHouse's own parser with ``bulk_parse="engine"``), with the same rules and order of
  writes as :meth:`write`; it writes nothing and returns None when it cannot vouch for every
  record (the caller then decodes in Python).
- :meth:`MessageStore.search` returns only the caller's account and agent, only threads the
  caller may see (see :func:`~memstream.projections.messages.sql.visible_threads_filter`),
  never one of ``spec.excluded_threads`` (deleted threads; left out inside every query, so
  hits are not lost to them), at most ``spec.limit`` hits ranked by relevance then recency.
  With an ``embedder`` (the dense side, :mod:`~memstream.projections.messages.vectors`), the
  BM25 list and the dense list (same filters, inside the query) are fused
  (:mod:`~memstream.projections.messages.fusion`); without one, or before any vector exists,
  the ranking is BM25's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

import pyarrow as pa
import pyarrow.compute as pc

from memstream.errors import PermanentInfraError, RetryableInfraError, StoreUnavailable
from memstream.infra.embeddings import Embedder
from memstream.projections.erased import ErasedThreads
from memstream.projections.messages.arrow_batch import parse_journal_values
from memstream.projections.messages.engine import ClickHouseEngine, Row
from memstream.projections.messages.fusion import bm25 as bm25_of
from memstream.projections.messages.fusion import coverage, fuse, query_weight
from memstream.projections.messages.lexical_index import (
    IndexColumns,
    IndexQuery,
    LexicalIndex,
    StoredMessage,
    close_indexes,
    document_terms,
    drop_index,
    open_index,
)
from memstream.projections.messages.postings import (
    POSTINGS_DEFERRED,
    POSTINGS_FILLING,
    POSTINGS_TABLE,
    POSTINGS_VIEW,
    POSTINGS_VIEW_VERSION,
    backfill_sql,
    one_term_sql,
    postings_table_ddl,
    postings_view_ddl,
    postings_view_upgrade,
    score_sql,
    term_stats_sql,
)
from memstream.projections.messages.ranking import (
    TermStats,
    every_term_essential,
    exact_with,
    impact_bound,
    plan,
    rarest_first,
    rerank,
    scores_directly,
    single_term_stats,
)
from memstream.projections.messages.rows import (
    MessageRow,
    ParsedBatch,
    messages_table,
    split_journal_batch,
    thread_users_table,
)
from memstream.projections.messages.sql import (
    BM25_B,
    BM25_K1,
    DEFAULT_DATABASE,
    DENSE_WINDOW,
    JOURNAL_BATCH_FORMAT,
    JOURNAL_BATCH_STRUCTURE,
    KIND_PYTHON,
    PROXIMITY_BOOST,
    PROXIMITY_WINDOW,
    RERANK_WINDOW,
    SearchSpec,
    check_database,
    collection_stats_sql,
    count_sql,
    ddl,
    dense_sql,
    erase_threads_sql,
    has_terms_sql,
    journal_batch_sql,
    messages_by_key_sql,
    optimize_sql,
    thread_keys_sql,
    thread_visible_sql,
    upgrade_ddl,
)
from memstream.projections.messages.text_table import (
    TEXT_FILLING,
    TEXT_TABLE,
    TEXT_VIEW,
    text_by_key_sql,
    text_delete_sql,
    text_key,
    text_table_ddl,
    text_view_ddl,
)
from memstream.projections.messages.text_table import backfill_sql as text_backfill_sql
from memstream.projections.messages.vector_index import (
    DenseIndex,
    DenseQuery,
    VectorRow,
    by_similarity,
    close_vector_indexes,
    drop_vector_indexes,
    model_dir,
    open_vector_index,
)
from memstream.schemas.records import ThreadRef

log = logging.getLogger(__name__)

STATS_TTL_S: Final = 30.0
"""How long an agent's BM25 collection statistics are reused."""
STATS_CACHE_SIZE: Final = 10_000
TERM_HINTS_SIZE: Final = 200_000
"""At most this many (account, agent, term) statistics kept as hints for the plan (a few
hundred bytes each); all are dropped past it."""
ERASE_CHUNK: Final = 500
"""Threads erased by one mutation per table (keeps the statement a few tens of KB)."""
OWNER_MAPS_MAX: Final = 10_000
"""At most this many agents' thread owners kept in memory for the lexical index's privacy
filter (re-read from ``thread_users`` when dropped)."""
HIDDEN_SETS_MAX: Final = 100_000
"""At most this many (agent, caller) hidden-thread lists kept (computed again when dropped)."""
INDEX_FILL_BATCH: Final = 200_000
"""Messages read from ClickHouse per step of a lexical index fill."""
ERASE_KEYS: Final = 5_000
"""Text keys deleted by one statement (a few hundred KB of literals)."""
VECTOR_FILL_BATCH: Final = 5_000
"""Vectors read from ClickHouse per step of a vector index fill (~8 MB at 384-d)."""
BulkParse = Literal["arrow", "engine"]
"""Who parses a raw batch in :meth:`MessageStore.parse_journal_batch`: pyarrow in this
process (the default: about half the cost, docs/transcript-search.md) or the ClickHouse
engine (``journal_batch_sql``, the previous path, kept for comparison)."""


Candidate = tuple[str, int, int, float, list[int], int, list[list[int]]]
"""One of BM25's best before the proximity rerank: thread_id, offset, created_ms, bm25, tf
per query word, length, positions per query word (:func:`~.ranking.rerank`'s rows)."""


@dataclass(frozen=True, slots=True)
class SearchHit:
    """One matching message, as ``journal_message_search`` returns it."""

    thread_id: str
    message_id: str
    offset: int
    role: str
    content: str
    created_at: datetime
    relevance: float
    explain: dict[str, object] | None = None
    """The score's parts when the search asked for them (``SearchSpec.explain``)."""


class MessageStore:
    """The ClickHouse message table of one deployment."""

    def __init__(
        self,
        engine: ClickHouseEngine,
        database: str = DEFAULT_DATABASE,
        erased: ErasedThreads | None = None,
        embedder: Embedder | None = None,
        *,
        bulk_parse: BulkParse = "arrow",
        index_root: Path | None = None,
        vector_root: Path | None = None,
        vector_process: bool = False,
    ) -> None:
        self.engine = engine
        # the vector indexes' directories (<vector_root>/<database>/<model>), or None: the
        # dense side scans message_vectors in ClickHouse (a ClickHouse server)
        self.vector_root = vector_root
        # each vector index in a child process of its own (qdrant-edge holds the GIL for a
        # whole query: in this process a search's walk stops the event loop)
        self.vector_process = vector_process
        # the lexical index's directories (one per database: <index_root>/<database>), or
        # None: BM25 from the posting lists (a ClickHouse server, or Tantivy not installed)
        self.index_root = index_root
        self.bulk_parse: BulkParse = bulk_parse
        # the dense side: query vectors at search time (vectors.MessageVectors writes them)
        self.embedder = embedder
        self.database = check_database(database)
        # erased threads are never written again, whatever the source (live or replay)
        self.erased = erased if erased is not None else ErasedThreads()
        self._stats: dict[tuple[str, str], tuple[float, tuple[float, float]]] = {}
        # (account, agent, term) -> the term's statistics as the last search saw them: they
        # only choose between two exact paths (see lexical_search), so they need no expiry
        self._term_hints: dict[tuple[str, str, str], TermStats] = {}
        # database -> whether its posting lists answer (:meth:`_has_postings`)
        self._postings: dict[str, bool] = {}
        # database -> whether its hits' text is read from ``message_text`` (:mod:`.text_table`)
        self._text: dict[str, bool] = {}
        # (database, account, agent) -> thread -> its users, for the threads that have any
        # (the private ones), as thread_users holds them: every writer of an embedded
        # database is this process (chdb locks its folder), and each write updates it
        self._owners: dict[tuple[str, str, str], dict[str, frozenset[str]]] = {}
        self._hidden: dict[tuple[str, str, str, str], list[str]] = {}
        self._owners_lock = asyncio.Lock()
        self._repairs: set[asyncio.Future[None]] = set()  # retags a search asked for

    async def ensure_schema(self, *, defer_postings: bool = False) -> None:
        """Create the database and tables if missing (idempotent). ``defer_postings`` (a
        replay's fresh target): the posting table without the view that fills it, marked
        as waiting for :meth:`seal_postings`; a table already sealed stays as it is.

        With a lexical index (``index_root``) the index is where BM25 finds its candidates,
        and there are **no posting lists**: a database that has them (searched by them
        before) keeps them while its index is filled (searches use them meanwhile), then
        they are dropped (their view cost every insert 2.5-5x: docs/transcript-search.md).
        Turning the index off later (``MEMSTREAM_TRANSCRIPT_INDEX=clickhouse``) fills them
        again from the stored rows at that start."""
        for stmt in ddl(self.database):
            await self.engine.command(stmt)
        rows = await self.engine.rows(has_terms_sql(self.database), {"database": self.database})
        if not rows or int(str(rows[0][0])) == 0:
            log.warning("messages table predates ranked search: adding its terms column")
            for stmt in upgrade_ddl(self.database):
                await self.engine.command(stmt)
        index = self.lexical_index()
        if index is None:
            if defer_postings:
                await self._defer_postings()
            else:
                await self._ensure_postings()
        await self._ensure_text(defer=defer_postings)
        if not defer_postings and self.embedder is not None:
            await self.ensure_vectors(self.embedder.model)
        if index is None:
            return
        counted = await self.engine.rows(f"SELECT count() FROM {self.database}.messages", {})
        stored = int(str(counted[0][0])) if counted else 0
        empty = not stored
        if not index.filling and empty and await index.count():
            # an index outliving its tables (a database dropped by hand): filled again
            log.warning("lexical index of %s holds messages its tables do not", self.database)
            index.mark_filling()
        if defer_postings:
            # a replay's target: a fresh one (empty) writes its index beside each insert of
            # the load, committed once by the seal; a resumed one holds rows whose
            # documents may not have been committed, so the seal fills it from them
            if empty:
                if index.filling:
                    await self._fill_index(index, 0)
                index.defer_commits()
            elif index.deferred or not index.filling:
                await index.flush()
                index.mark_filling()
            return
        if index.filling:
            await self._fill_index(index, stored)
        await self._retire_postings()

    async def _retire_postings(self) -> None:
        """Drop the posting lists (view, table, markers) of a database whose lexical index
        is filled: nothing reads them any more. Table and view go together, so a later start
        without the index finds no table and fills it from the stored rows, never a stale
        one. Idempotent."""
        db = self.database
        has_view, has_table, deferred, filling = await self._tables(
            POSTINGS_VIEW, POSTINGS_TABLE, POSTINGS_DEFERRED, POSTINGS_FILLING
        )
        if not (has_view or has_table or deferred or filling):
            return
        log.warning(
            "%s: dropping its posting lists, the lexical index serves BM25 now (they come "
            "back, filled from the stored rows, at a start with MEMSTREAM_TRANSCRIPT_INDEX="
            "clickhouse)",
            db,
        )
        await self.engine.command(f"DROP VIEW IF EXISTS {db}.{POSTINGS_VIEW}")
        for table in (POSTINGS_TABLE, POSTINGS_DEFERRED, POSTINGS_FILLING):
            await self.engine.command(f"DROP TABLE IF EXISTS {db}.{table}")
        self._postings[db] = False

    async def _has_postings(self) -> bool:
        """Whether this database's posting lists can answer (there, and neither deferred nor
        being filled); looked up once per database, then kept."""
        db = self.database
        known = self._postings.get(db)
        if known is None:
            table, deferred, filling = await self._tables(
                POSTINGS_TABLE, POSTINGS_DEFERRED, POSTINGS_FILLING
            )
            known = table and not deferred and not filling
            if known:
                self._postings[db] = True  # a table that answers never stops answering here
        return known

    def vector_index(self, model: str, database: str | None = None) -> DenseIndex | None:
        """The vector index of ``model``'s vectors in ``database`` (this store's by default),
        opened on first use; None without a ``vector_root``."""
        if self.vector_root is None:
            return None
        return open_vector_index(
            self.vector_root / (database or self.database) / model_dir(model),
            process=self.vector_process,
        )

    async def ensure_vectors(self, model: str) -> None:
        """Fill this database's vector index of ``model`` from ``message_vectors`` when it
        is missing, was interrupted while filling, or holds fewer points than the table has
        vectors (a shard deleted or lost); idempotent, a no-op without a ``vector_root``.
        The vector loop writes the index first, so a shard holding *more* is only a step
        ahead of the table, never behind it."""
        index = self.vector_index(model)
        if index is None:
            return
        db = self.database
        rows = await self.engine.rows(
            f"SELECT uniqExact(account_id, agent_id, thread_id, `offset`) "
            f"FROM {db}.message_vectors WHERE model = {{model:String}}",
            {"model": model},
        )
        stored = int(str(rows[0][0])) if rows else 0
        if not index.filling and await index.count() >= stored:
            return
        log.warning("filling the vector index of %s (%s) from its %d vectors", db, model, stored)
        started = time.perf_counter()

        async def batches() -> AsyncIterator[list[VectorRow]]:
            after: tuple[str, str, str, int] = ("", "", "", -1)
            while True:
                table = await self.engine.arrow(
                    f"""SELECT account_id, agent_id, thread_id, `offset`, vec
FROM {db}.message_vectors
WHERE model = {{model:String}}
  AND (account_id, agent_id, thread_id, `offset`) > ({{a:String}}, {{g:String}}, {{t:String}}, {{o:Int64}})
ORDER BY account_id, agent_id, thread_id, `offset`
LIMIT {VECTOR_FILL_BATCH}""",
                    {"model": model, "a": after[0], "g": after[1], "t": after[2], "o": after[3]},
                )
                if not table.num_rows:
                    return
                cols = [
                    table.column(c).to_pylist()
                    for c in ("account_id", "agent_id", "thread_id", "offset")
                ]
                vecs = table.column("vec").combine_chunks()
                flat = vecs.values.to_numpy(zero_copy_only=False)
                dims = len(flat) // len(vecs) if len(vecs) else 0
                matrix = flat.reshape(len(vecs), dims)
                out = []
                for i, (a, g, t, o) in enumerate(zip(*cols, strict=True)):
                    if (a, g, t, o) != after:  # unmerged copies are adjacent: keep one
                        out.append(VectorRow(a, g, t, o, matrix[i]))
                        after = (a, g, t, o)
                yield out

        n = await index.fill(batches)
        log.warning(
            "vector index of %s filled: %d vectors in %.1f s", db, n, time.perf_counter() - started
        )

    def lexical_index(self, database: str | None = None) -> LexicalIndex | None:
        """The Tantivy index of ``database`` (this store's by default), opened on first use;
        None without an ``index_root``."""
        if self.index_root is None:
            return None
        return open_index(self.index_root / (database or self.database))

    async def _fill_index(self, index: LexicalIndex, total: int | None = None) -> None:
        """Fill ``index`` from the stored messages (their terms as ClickHouse computed them),
        ordered by key and read in steps, under its filling marker. ``total``: the stored
        rows when the caller has counted them (for the log lines)."""
        db = self.database
        if total is None:
            stored = await self.engine.rows(f"SELECT count() FROM {db}.messages", {})
            total = int(str(stored[0][0])) if stored else 0
        if total:
            log.warning("filling the lexical index of %s from its %d messages", db, total)
        started = time.perf_counter()

        async def batches() -> AsyncIterator[IndexColumns]:
            # every thread's users, read once the index is marked filling: a thread that
            # gains one later is retagged when the fill ends (LexicalIndex.retag)
            owners = await self.engine.rows(
                f"SELECT account_id, agent_id, thread_id, groupUniqArray(user_id) "
                f"FROM {db}.thread_users GROUP BY account_id, agent_id, thread_id",
                {},
            )
            readers = {(str(a), str(g), str(t)): frozenset(_strings(us)) for a, g, t, us in owners}
            # in key order without FINAL (3-4x cheaper a step): a message's unmerged copies
            # are adjacent, and only the first is kept (_first_copies); the columns go to the
            # index as they are (IndexColumns), made Python values on its thread
            after: tuple[str, str, str, int] = ("", "", "", -1)
            while True:
                table = await self.engine.arrow(
                    f"""SELECT account_id, agent_id, thread_id, `offset`,
       toUnixTimestamp64Milli(created_at) AS created_ms, arrayStringConcat(terms, ' ') AS body,
       content, message_id, role
FROM {db}.messages
WHERE (account_id, agent_id, thread_id, `offset`) > ({{a:String}}, {{g:String}}, {{t:String}}, {{o:Int64}})
ORDER BY account_id, agent_id, thread_id, `offset`
LIMIT {INDEX_FILL_BATCH}""",
                    {"a": after[0], "g": after[1], "t": after[2], "o": after[3]},
                )
                if not table.num_rows:
                    return
                last = table.slice(table.num_rows - 1).to_pylist()[0]
                after = (
                    str(last["account_id"]),
                    str(last["agent_id"]),
                    str(last["thread_id"]),
                    int(last["offset"]),
                )
                table = _first_copies(table)
                yield IndexColumns(
                    table.column("account_id"),
                    table.column("agent_id"),
                    table.column("thread_id"),
                    table.column("offset"),
                    table.column("created_ms"),
                    table.column("content"),
                    table.column("message_id"),
                    table.column("role"),
                    readers,
                    table.column("body"),
                )

        n = await index.fill(batches)
        if total:
            log.warning(
                "lexical index of %s filled: %d documents in %.1f s",
                db,
                n,
                time.perf_counter() - started,
            )

    async def _ensure_text(self, *, defer: bool = False) -> None:
        """The hits' text table and the view that fills it at every insert; for a
        ``messages`` table made before it, filled from the stored rows (a one-off, a marker
        standing while it runs, as for the postings; readers use ``messages`` meanwhile).
        ``defer`` (a replay's target): the table and the marker only, filled once by
        :meth:`seal_postings` (one ``INSERT ... SELECT`` costs less than a write per batch
        through the view: docs/operations.md). An engine without ``EmbeddedRocksDB`` keeps
        reading the text from ``messages``."""
        db = self.database
        has_table, filling, has_view = await self._tables(TEXT_TABLE, TEXT_FILLING, TEXT_VIEW)
        if has_table and not filling:
            await self.engine.command(text_view_ddl(db))
            self._text[db] = True
            return
        await self.engine.command(
            f"CREATE TABLE IF NOT EXISTS {db}.{TEXT_FILLING} (x UInt8) ENGINE = Log"
        )
        self._text[db] = False
        try:
            await self.engine.command(text_table_ddl(db))
        except (PermanentInfraError, RetryableInfraError) as e:
            if "UNKNOWN_STORAGE" not in str(e) and "EmbeddedRocksDB" not in str(e):
                raise
            log.warning(
                "no EmbeddedRocksDB in this ClickHouse: search reads its hits' text from messages"
            )
            await self.engine.command(f"DROP TABLE IF EXISTS {db}.{TEXT_FILLING}")
            return
        if defer and not has_view:  # (with the view: a seal interrupted in its fill)
            return
        await self.engine.command(text_view_ddl(db))
        stored = await self.engine.rows(f"SELECT count() FROM {db}.messages", {})
        if stored and int(str(stored[0][0])) and not defer:
            log.warning("filling %s.%s from the stored messages (one-off)", db, TEXT_TABLE)
        await self.engine.command(text_backfill_sql(db))
        await self.engine.command(f"DROP TABLE {db}.{TEXT_FILLING}")
        self._text[db] = True

    async def _has_text(self) -> bool:
        """Whether this database's hits' text is read from ``message_text``: the table is
        there and filled (looked up once per database by a process that did not make it)."""
        db = self.database
        known = self._text.get(db)
        if known is None:
            has_table, filling = await self._tables(TEXT_TABLE, TEXT_FILLING)
            known = self._text[db] = has_table and not filling
        return known

    async def _ensure_postings(self) -> None:
        """The posting lists and the view that fills them at every insert; for a
        ``messages`` table made before them, filled from the stored rows (a one-off). A
        marker table stands while that fill runs, so a start interrupted during it fills
        again (postings of the same message collapse: the queries read ``FINAL``)."""
        db = self.database
        has_table, filling = await self._tables(POSTINGS_TABLE, POSTINGS_FILLING)
        if has_table and not filling:
            await self._current_view()
            return
        await self.engine.command(
            f"CREATE TABLE IF NOT EXISTS {db}.{POSTINGS_FILLING} (x UInt8) ENGINE = Log"
        )
        await self.engine.command(postings_table_ddl(db))
        await self.engine.command(postings_view_ddl(db))
        stored = await self.engine.rows(f"SELECT count() FROM {db}.messages", {})
        if stored and int(str(stored[0][0])):
            log.warning("filling the posting lists of %s.messages from its rows (one-off)", db)
        await self.engine.command(backfill_sql(db, POSTINGS_TABLE))
        await self.engine.command(f"DROP TABLE {db}.{POSTINGS_FILLING}")

    async def _current_view(self) -> None:
        """The postings view, created if missing, and upgraded in place when an earlier
        release made it (its comment is not :data:`POSTINGS_VIEW_VERSION`): the live
        projector would otherwise pay the old SQL on every insert until the next replay."""
        db = self.database
        found = await self.engine.rows(
            "SELECT comment FROM system.tables WHERE database = {database:String} "
            "AND name = {view:String}",
            {"database": db, "view": POSTINGS_VIEW},
        )
        if not found:
            await self.engine.command(postings_view_ddl(db))
        elif str(found[0][0]) != POSTINGS_VIEW_VERSION:
            log.warning(
                "upgrading %s.%s to the current postings SQL (%s)",
                db,
                POSTINGS_VIEW,
                POSTINGS_VIEW_VERSION,
            )
            for stmt in postings_view_upgrade(db):
                await self.engine.command(stmt)

    async def _tables(self, *names: str) -> list[bool]:
        db = self.database
        found = await self.engine.rows(
            "SELECT name FROM system.tables WHERE database = {database:String} "
            "AND name IN {names:Array(String)}",
            {"database": db, "names": list(names)},
        )
        present = {str(r[0]) for r in found}
        return [n in present for n in names]

    async def _defer_postings(self) -> None:
        db = self.database
        (has_view,) = await self._tables(POSTINGS_VIEW)
        if has_view:  # sealed, or sealing when interrupted: the view fills what comes
            return
        await self.engine.command(
            f"CREATE TABLE IF NOT EXISTS {db}.{POSTINGS_DEFERRED} (x UInt8) ENGINE = Log"
        )
        await self.engine.command(postings_table_ddl(db))

    async def seal_postings(self) -> None:
        """The views, then the postings and the text of the rows stored without them, then
        the markers go (idempotent: a seal interrupted after a fill fills again, and the
        copies collapse as a replay's do). Exact only while nothing else writes into the
        tables, as in a replay's target before its switch."""
        db = self.database
        index = self.lexical_index()
        if index is None:
            has_view, deferred = await self._tables(POSTINGS_VIEW, POSTINGS_DEFERRED)
            if not deferred:
                if not has_view:
                    await self._ensure_postings()
            else:
                await self.engine.command(postings_view_ddl(db))
                await self.engine.command(backfill_sql(db, POSTINGS_TABLE))
                await self.engine.command(f"DROP TABLE {db}.{POSTINGS_DEFERRED}")
        await self._ensure_text()  # the deferred text too: its view, then one fill
        if index is not None:
            await index.flush()  # the load's documents, held since the target was made
            if index.filling:  # a resumed replay's: one fill from the rows
                await self._fill_index(index)
            await self._retire_postings()  # (a target an earlier release deferred them in)

    async def write(self, rows: Sequence[MessageRow]) -> int:
        """Insert a batch; returns the message rows written. Durable on return. Rows of
        erased threads are dropped."""
        if len(self.erased):
            await self.erased.refresh()
            rows = [r for r in rows if (r.account_id, r.agent_id, r.thread_id) not in self.erased]
        if not rows:
            return 0
        table = messages_table(rows)
        await self._write_tables(thread_users_table(rows), table)
        return int(table.num_rows)

    async def _write_tables(self, owners: pa.Table, messages: pa.Table) -> None:
        """A batch's owners (``thread_users``), then, in the lexical index, the documents so
        far of each thread that gained a user given its new readers, then its messages
        (ClickHouse and the index side by side). Durable on return."""
        if owners.num_rows:
            await self.engine.insert_arrow(self.database, "thread_users", owners)
            await self._owners_written(owners)
        index = self.lexical_index()
        if index is None:
            if messages.num_rows:
                await self._insert_messages(messages, None, None)
            return
        owned = set(_triples(owners))
        readers = await self._readers(owned | set(_triples(messages)))
        retag = [(a, g, t, readers[(a, g, t)]) for a, g, t in sorted(owned)]
        if messages.num_rows:
            await self._insert_messages(messages, index, _index_columns(messages, readers), retag)
        elif retag:
            await index.retag(retag)

    async def _insert_messages(
        self,
        table: pa.Table,
        index: LexicalIndex | None,
        index_rows: IndexColumns | None,
        retag: Sequence[tuple[str, str, str, frozenset[str]]] = (),
    ) -> None:
        """The ``messages`` insert (its views write the postings and the text) and, side by
        side (each on its own thread), the lexical index's retag of the threads that gained
        a user (``retag``) then its upsert; durable when both have returned. Both after the
        owners: a message is never searchable before its thread's privacy is known."""
        insert = self.engine.insert_arrow(self.database, "messages", table)
        if index is None or index_rows is None:
            await insert
            return

        async def indexed_after_retag() -> int:
            await index.retag(retag)
            return await index.upsert(index_rows)

        inserted, indexed = await asyncio.gather(
            insert, indexed_after_retag(), return_exceptions=True
        )
        if isinstance(inserted, BaseException):
            # nothing in the index that ClickHouse does not hold (the batch is retried)
            with contextlib.suppress(Exception):
                await index.delete_keys(index_rows.keys())
            raise inserted
        if isinstance(indexed, BaseException):
            raise indexed

    async def write_journal_batch(self, values: Sequence[bytes]) -> ParsedBatch | None:
        """Project raw journal records (JSON envelopes) in bulk; durable on return.

        The batch is parsed in bulk (:meth:`parse_journal_batch`), and :meth:`write`'s two
        inserts follow (``thread_users`` first). Returns what
        was written, or None -- having written nothing -- when the batch does not parse
        strictly, when any record is not in the canonical form the SQL checks, or when the
        records do not map one to one onto parsed rows: the caller then takes the Python
        path, which dead-letters exactly the bad records. Records of erased threads are
        dropped first.
        """
        parsed = await self.parse_journal_batch(values)
        if parsed is None:
            return None
        batch = split_journal_batch(parsed)
        await self.write_parsed(batch)
        return batch

    async def parse_journal_batch(
        self, values: Sequence[bytes], *, event_id: bool = False
    ) -> pa.Table | None:
        """The rows of :func:`~.sql.journal_batch_sql` for ``values`` (records of erased
        threads dropped first; ``event_id``: with the envelopes' ids as a last column), or
        None when the bulk path cannot vouch for every record (see
        :meth:`write_journal_batch`). Parsed by pyarrow
        (:func:`~.arrow_batch.parse_journal_values`, same rules) unless ``bulk_parse`` is
        ``"engine"``. Writes nothing."""
        await self.erased.refresh()
        if self.bulk_parse == "arrow":  # all of it off the event loop (C++ mostly)
            return await asyncio.to_thread(self._parse_in_arrow, values, event_id=event_id)
        values = self.erased.keep_values(values)
        if not values or not all(v[:1] == b"{" and v[-1:] == b"}" for v in values):
            return None
        return _vouched(await self._parse_in_engine(values, event_id=event_id))

    def _parse_in_arrow(self, values: Sequence[bytes], *, event_id: bool) -> pa.Table | None:
        """Blocking: erased threads' records dropped, then :func:`parse_journal_values`
        (which checks each record is one ``{...}``)."""
        return _vouched(parse_journal_values(self.erased.keep_values(values), event_id=event_id))

    async def _parse_in_engine(self, values: Sequence[bytes], *, event_id: bool) -> pa.Table | None:
        try:
            parsed = await self.engine.query_input_arrow(
                lambda source: journal_batch_sql(source, event_id=event_id),
                b"\n".join(values),
                JOURNAL_BATCH_FORMAT,
                JOURNAL_BATCH_STRUCTURE,
            )
        except (RetryableInfraError, PermanentInfraError) as e:
            # Bad records fail the strict parse; so would an engine that cannot run the
            # bulk SQL at all, which would make every batch take the slow path: say so.
            log.info("bulk journal parse failed, batch goes to the Python path: %s", e)
            return None
        return parsed if parsed.num_rows == len(values) else None

    async def write_parsed(self, batch: ParsedBatch) -> int:
        """Insert a parsed batch (``thread_users`` first, as :meth:`write`); durable on
        return. Returns the message rows written."""
        await self._write_tables(batch.owners, batch.messages)
        return int(batch.messages.num_rows)

    async def _owners_written(self, owners: pa.Table) -> None:
        """Owners just inserted into ``thread_users``: into the loaded owner maps too (under
        the lock a load holds, so a load never misses a write it did not read)."""
        async with self._owners_lock:
            changed: set[tuple[str, str, str]] = set()
            for a, g, t, u in zip(
                *(
                    owners.column(c).to_pylist()
                    for c in ("account_id", "agent_id", "thread_id", "user_id")
                ),
                strict=True,
            ):
                key = (self.database, a, g)
                threads = self._owners.get(key)
                if threads is None:
                    continue  # not loaded: a load reads it from thread_users
                users = threads.get(t, frozenset())
                if u not in users:
                    threads[t] = users | {u}
                    changed.add(key)
            if changed:
                self._hidden = {k: v for k, v in self._hidden.items() if k[:3] not in changed}

    async def _hidden_of(self, spec: SearchSpec) -> list[str]:
        """:meth:`_hidden_threads` for ``spec``: none for an operator's search."""
        if spec.every_user:
            return []
        return await self._hidden_threads(spec.account_id, spec.agent_id, spec.user_id or "")

    async def _hidden_threads(self, account_id: str, agent_id: str, user_id: str) -> list[str]:
        """Thread keys (:attr:`~memstream.schemas.records.ThreadRef.key`) of the agent's threads the caller
        may not read: those with users, none of them ``user_id`` (``""``: every thread with
        users), as :func:`~.sql.visible_threads_filter` decides."""
        key = (self.database, account_id, agent_id)
        cached = self._hidden.get((*key, user_id))
        if cached is not None:
            return cached
        async with self._owners_lock:
            threads = await self._owner_map(account_id, agent_id)
            hidden = sorted(
                ThreadRef(account_id, agent_id, t).key
                for t, us in threads.items()
                if user_id not in us
            )
            if len(self._hidden) >= HIDDEN_SETS_MAX:
                self._hidden.clear()
            self._hidden[(*key, user_id)] = hidden
            return hidden

    async def _owner_map(self, account_id: str, agent_id: str) -> dict[str, frozenset[str]]:
        """The agent's threads that have users, with their users (loaded from
        ``thread_users`` when not held). Under ``_owners_lock``."""
        key = (self.database, account_id, agent_id)
        threads = self._owners.get(key)
        if threads is None:
            rows = await self.engine.rows(
                f"SELECT thread_id, groupUniqArray(user_id) FROM {self.database}.thread_users "
                "WHERE account_id = {account_id:String} AND agent_id = {agent_id:String} "
                "GROUP BY thread_id",
                {"account_id": account_id, "agent_id": agent_id},
            )
            if len(self._owners) >= OWNER_MAPS_MAX:
                self._owners.clear()
                self._hidden.clear()
            threads = self._owners[key] = {str(t): frozenset(_strings(us)) for t, us in rows}
        return threads

    async def _readers(
        self, threads: Iterable[tuple[str, str, str]]
    ) -> dict[tuple[str, str, str], frozenset[str]]:
        """The users of each (account, agent, thread) as ``thread_users`` holds them now
        (empty: none), for the lexical index's readers."""
        out: dict[tuple[str, str, str], frozenset[str]] = {}
        async with self._owners_lock:
            for a, g, t in threads:
                out[(a, g, t)] = (await self._owner_map(a, g)).get(t, NOBODY)
        return out

    async def collection_stats(self, account_id: str, agent_id: str) -> tuple[float, float]:
        """(messages, average length in terms) of an agent, for BM25; cached for
        :data:`STATS_TTL_S` (term statistics move slowly, and reading them costs a scan of the
        agent's array sizes, which a search must not pay every time)."""
        now = time.monotonic()
        hit = self._stats.get((account_id, agent_id))
        if hit is not None and now - hit[0] < STATS_TTL_S:
            return hit[1]
        rows = await self.engine.rows(
            collection_stats_sql(self.database), {"account_id": account_id, "agent_id": agent_id}
        )
        n = float(str(rows[0][0])) if rows else 0.0
        avg = float(str(rows[0][1])) if rows and n > 0 else 1.0
        if len(self._stats) > STATS_CACHE_SIZE:
            self._stats.clear()
        self._stats[(account_id, agent_id)] = (now, (n, avg))
        return n, avg

    async def search(self, spec: SearchSpec) -> list[SearchHit]:
        if self.embedder is None or not spec.text.strip():
            return await self.lexical_search(spec)
        model = self.embedder.model
        wide = replace(spec, limit=max(spec.limit, DENSE_WINDOW), explain=True)
        index = self.vector_index(model)
        if index is not None and index.ready:
            nearest, keyed, lexical, others = await self._indexed_sides(spec, wide, index)
            dense = by_similarity({**nearest, **keyed})
        else:
            # the query vector is computed while ClickHouse runs BM25 (both off the loop)
            embedded, lexical = await asyncio.gather(
                self.embedder.embed_query([spec.text]), self.lexical_search(wide)
            )
            keys = [(h.thread_id, h.offset) for h in lexical]
            dense = await self.dense(spec, embedded[0], model, keys)
            others = await self._others(spec, lexical, dense)
        by_key = {(h.thread_id, h.offset): h for h in lexical}
        weight = _query_weight(lexical)
        scores = {k: coverage(h.relevance, weight) for k, h in by_key.items()}
        by_key.update(others)
        scores.update({k: coverage(h.relevance, weight) for k, h in others.items()})
        fused = fuse(scores, dense)
        out: list[SearchHit] = []
        seen: set[tuple[str, str]] = set()
        for f in fused:
            hit = by_key.get(f.key)
            if hit is None:  # erased between the two queries
                continue
            if (hit.thread_id, hit.content) in seen:
                continue  # the same words again in the same thread: one hit says it
            seen.add((hit.thread_id, hit.content))
            explain = None
            if spec.explain:
                explain = dict(hit.explain or _no_lexical_parts())
                explain["fusion"] = {
                    "bm25_coverage": round(f.lexical, 6),
                    "query_weight": round(weight, 6),
                    "dense_normalised": round(f.dense, 6),
                    "dense_similarity": (round(dense[f.key], 6) if f.key in dense else None),
                    "model": self.embedder.model,
                }
            out.append(replace(hit, relevance=f.relevance, explain=explain))
            if len(out) == spec.limit:
                break
        return out

    async def _others(
        self,
        spec: SearchSpec,
        lexical: Sequence[SearchHit],
        dense: dict[tuple[str, int], float],
        rows: Sequence[Row] | None = None,
    ) -> dict[tuple[str, int], SearchHit]:
        """The dense side's candidates BM25's list lacks, with their BM25 (:meth:`_hits_at`;
        ``rows``: :meth:`_rows_at` of the dense side's keys, already read)."""
        in_lexical = {(h.thread_id, h.offset) for h in lexical}
        missing = [k for k in dense if k not in in_lexical]
        if not missing:
            return {}
        stats = lexical[0].explain if lexical else None
        if rows is None:
            got = await self._hits_at(spec, missing, stats)
        else:
            wanted = set(missing)
            kept = [r for r in rows if (str(r[0]), int(str(r[2]))) in wanted]
            got = await self._scored(spec, kept, stats)
        # in the dense side's order, whatever order the rows came in: the fusion keeps it
        # among equal scores
        return {k: got[k] for k in missing if k in got}

    async def _indexed_sides(
        self, spec: SearchSpec, wide: SearchSpec, index: DenseIndex
    ) -> tuple[
        dict[tuple[str, int], float],
        dict[tuple[str, int], float],
        list[SearchHit],
        dict[tuple[str, int], SearchHit],
    ]:
        """Both sides with the dense list from ``index``: (the dense list, the similarity of
        BM25's candidates, BM25's hits, the dense list's others with their BM25).

        Each step starts as soon as what it needs is there: the query's embedding (with the
        caller's hidden threads) beside BM25; the walk once the vector is there, and the
        text and terms of the messages it found that BM25's list lacks right after it; the
        similarity of BM25's candidates (an exact scan of at most
        DENSE_WINDOW points by id) once the vector and BM25's list are there; the others'
        BM25 (arithmetic on the rows read) once all is."""
        assert self.embedder is not None
        embedding = asyncio.ensure_future(
            asyncio.gather(self.embedder.embed_query([spec.text]), self._hidden_thread_ids(spec))
        )
        bm25 = asyncio.ensure_future(self.lexical_search(wide))
        pending: list[asyncio.Future[Any]] = [embedding, bm25]

        async def walk_then_rows(
            vector: Sequence[float], hidden: Sequence[str]
        ) -> tuple[dict[tuple[str, int], float], list[Row]]:
            nearest = await index.nearest(self._dense_query(spec, vector, hidden, DENSE_WINDOW))
            # the messages BM25's list holds need no reading (it is there by now, as a rule:
            # BM25 runs beside the embedding, the walk after it)
            listed = {(h.thread_id, h.offset) for h in await bm25}
            return nearest, await self._rows_at(spec, [k for k in nearest if k not in listed])

        try:
            embedded, hidden = await embedding
            vector = embedded[0]
            walk = asyncio.ensure_future(walk_then_rows(vector, hidden))
            pending.append(walk)
            lexical = await bm25
            keys = [(h.thread_id, h.offset) for h in lexical]
            similarities = asyncio.ensure_future(
                index.nearest(self._dense_query(spec, vector, hidden, 0, keys))
            )
            pending.append(similarities)
            nearest, rows = await walk
            others = await self._others(spec, lexical, nearest, rows)
            return nearest, await similarities, lexical, others
        finally:
            for f in pending:  # a step failed or the search was cancelled: none left running
                if not f.done():
                    f.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def _hidden_thread_ids(self, spec: SearchSpec) -> list[str]:
        """The ids of the agent's threads the caller may not read, and of the threads the
        search leaves out (``spec.excluded_threads``: deleted ones)."""
        hidden = await self._hidden_of(spec)
        prefix = len(ThreadRef(spec.account_id, spec.agent_id, "").key)
        ids = [h[prefix:] for h in hidden]
        if spec.excluded_threads:
            ids = sorted({*ids, *spec.excluded_threads})
        return ids

    @staticmethod
    def _excluded_keys(spec: SearchSpec) -> list[str]:
        """Thread keys of ``spec.excluded_threads`` (the lexical index's ``thread_key``)."""
        return [ThreadRef(spec.account_id, spec.agent_id, t).key for t in spec.excluded_threads]

    @staticmethod
    def _dense_query(
        spec: SearchSpec,
        vector: Sequence[float],
        hidden: Sequence[str],
        k: int,
        keys: Sequence[tuple[str, int]] = (),
        exact: bool | None = None,
    ) -> DenseQuery:
        return DenseQuery(
            spec.account_id,
            spec.agent_id,
            vector,
            k,
            thread_id=spec.thread_id,
            hidden_threads=hidden,
            keys=keys,
            exact=exact,
        )

    async def dense(
        self,
        spec: SearchSpec,
        vector: Sequence[float],
        model: str,
        keys: Sequence[tuple[str, int]] = (),
        *,
        exact: bool | None = None,
    ) -> dict[tuple[str, int], float]:
        """The dense side: ``{(thread_id, offset): similarity}`` of the :data:`DENSE_WINDOW`
        visible messages nearest to ``vector``, and of those at ``keys`` (BM25's candidates)
        that have a vector. From the vector index when there is one and it is filled
        (:mod:`.vector_index`; ``exact`` as :attr:`DenseQuery.exact`), else one scan of
        ``message_vectors`` (:func:`~.sql.dense_sql`)."""
        index = self.vector_index(model)
        if index is not None and index.ready:
            hidden = await self._hidden_thread_ids(spec)
            return await index.nearest(
                self._dense_query(spec, vector, hidden, DENSE_WINDOW, keys, exact)
            )
        sql, params = dense_sql(self.database, spec, vector, model, DENSE_WINDOW, keys)
        return {
            (str(t), int(str(o))): float(str(sim))
            for t, o, sim in await self.engine.rows(sql, params)
        }

    async def _hits_at(
        self,
        spec: SearchSpec,
        keys: Sequence[tuple[str, int]],
        stats: dict[str, object] | None,
    ) -> dict[tuple[str, int], SearchHit]:
        """The messages at ``keys``, each with its BM25 (relevance) computed from the
        query's terms' df in ``stats`` (a BM25 hit's explain parts; None: no visible
        message holds a query term, so every BM25 is 0) and the agent's statistics
        (:meth:`collection_stats`, as BM25's list used them): :meth:`_rows_at`, then
        :meth:`_scored`."""
        return await self._scored(spec, await self._rows_at(spec, keys), stats)

    async def _rows_at(self, spec: SearchSpec, keys: Sequence[tuple[str, int]]) -> list[Row]:
        """Rows thread_id, message_id, offset, role, content, created_ms, terms of the
        messages at ``keys`` (the dense side's, which only lists what the caller may see;
        the lexical index drops the caller's hidden threads again). From its documents where
        it is there (~1-2 ms for 50 keys); the keys it lacks (a message without a term) by
        point reads from ``message_text``, analysed here (the stored ``terms``' analysis,
        :func:`~.lexical_index.document_terms`: ~5 µs a message, where reading ``messages``
        by key costs 7-18 ms a statement); else ``messages`` with its ``terms``."""
        rows: list[Row] = []
        index = self.lexical_index()
        if index is not None and not index.filling:
            hidden = await self._hidden_of(spec)
            docs = await index.documents(
                spec.account_id,
                spec.agent_id,
                [text_key(spec.account_id, spec.agent_id, t, o) for t, o in keys],
                [*hidden, *self._excluded_keys(spec)],
            )
            rows = [
                (
                    d.thread_id,
                    d.record.message_id,
                    d.offset,
                    d.record.role,
                    d.record.content,
                    d.created_ms,
                    d.terms,
                )
                for d in docs
            ]
            found = {(d.thread_id, d.offset) for d in docs}
            keys = [k for k in keys if k not in found]
        if keys and await self._has_text():
            rows += [(*r, document_terms(str(r[4]))) for r in await self._text_at(spec, keys)]
        elif keys:
            rows += await self.engine.rows(
                messages_by_key_sql(self.database),
                {
                    "account_id": spec.account_id,
                    "agent_id": spec.agent_id,
                    "thread_ids": [k[0] for k in keys],
                    "offsets": [k[1] for k in keys],
                },
            )
        return rows

    async def _scored(
        self, spec: SearchSpec, rows: Sequence[Row], stats: dict[str, object] | None
    ) -> dict[tuple[str, int], SearchHit]:
        """:meth:`_rows_at`'s rows as hits with their BM25 (see :meth:`_hits_at`)."""
        # the agent's statistics as BM25's list used them (cached), unrounded
        n_docs, avg_len = await self.collection_stats(spec.account_id, spec.agent_id)
        out = {}
        for thread_id, message_id, offset, role, content, created_ms, stored_terms in rows:
            terms = _strings(stored_terms)
            tfs = [terms.count(w) for w in spec.words]
            score = 0.0
            if stats is not None:
                per_term = stats["terms"]
                assert isinstance(per_term, dict)
                score = bm25_of(
                    tfs,
                    [float(per_term[w]["df"]) for w in spec.words],
                    n_docs,
                    len(terms),
                    avg_len,
                    BM25_K1,
                    BM25_B,
                )
            hit = SearchHit(
                thread_id=str(thread_id),
                message_id=str(message_id),
                offset=int(str(offset)),
                role=str(role),
                content=str(content),
                created_at=datetime.fromtimestamp(int(str(created_ms)) / 1000, tz=UTC),
                relevance=score,
                explain={
                    **_no_lexical_parts(),
                    "bm25": round(score, 6),
                    "terms": {w: {"tf": tf} for w, tf in zip(spec.words, tfs, strict=True)},
                    "length": len(terms),
                },
            )
            out[(hit.thread_id, hit.offset)] = hit
        return out

    async def _index_best(
        self,
        index: LexicalIndex,
        spec: SearchSpec,
        stats: tuple[float, float],
        k: int,
        texts: dict[tuple[str, int], StoredMessage],
    ) -> tuple[list[Candidate], list[int]]:
        """BM25's best ``k`` from the lexical index: Tantivy's candidates re-scored with the
        same statistics (:meth:`~.lexical_index.LexicalIndex.best`), the caller's hidden
        threads filtered out inside the query; their stored messages into ``texts``."""
        hidden = await self._hidden_of(spec)
        found = await index.best(
            IndexQuery(
                spec.account_id,
                spec.agent_id,
                spec.thread_id,
                spec.words,
                hidden,
                stats,
                k,
                (BM25_K1, BM25_B),
                spec.user_id or "",
                self._excluded_keys(spec),
            )
        )
        if found.stale:
            self._repair_readers(index, spec.account_id, spec.agent_id, found.stale)
        texts.update(((h.thread_id, h.offset), h.record) for h in found.hits)
        return [
            (
                h.thread_id,
                h.offset,
                h.created_ms,
                h.bm25,
                list(h.tf),
                h.length,
                [list(p) for p in h.positions],
            )
            for h in found.hits
        ], found.dfs

    def _repair_readers(
        self, index: LexicalIndex, account_id: str, agent_id: str, threads: Sequence[str]
    ) -> None:
        """Threads a search found tagged readable by a caller they are hidden from (a retag
        lost to a crash, or a write between its owners and its retag): logged, and
        retagged from the owner map in the background (a no-op once the write's own retag
        has run)."""
        log.warning(
            "lexical index of %s: threads %s of %s/%s have documents tagged for readers "
            "they no longer have (a retag lost, or a write in progress); the search "
            "excluded them by key, retagging them now",
            self.database,
            list(threads),
            account_id,
            agent_id,
        )

        async def repair() -> None:
            try:
                readers = await self._readers((account_id, agent_id, t) for t in threads)
                await index.retag([(*k, users) for k, users in readers.items()])
            except Exception as e:  # noqa: BLE001 - the next search asks again
                log.warning(
                    "retagging %s of %s/%s failed: %r", list(threads), account_id, agent_id, e
                )

        task = asyncio.ensure_future(repair())
        self._repairs.add(task)
        task.add_done_callback(self._repairs.discard)

    async def _posting_best(
        self, spec: SearchSpec, stats: tuple[float, float], k: int
    ) -> tuple[list[Candidate], list[int]]:
        """BM25's best ``k`` from the posting lists in ClickHouse."""
        n_docs, avg_len = stats
        if scores_directly(len(spec.words), spec.thread_id is not None) or self._plans_every_term(
            spec, n_docs, avg_len, k
        ):
            # one thread holds few messages, one or two words gain less from pruning than
            # the statistics cost, and the hints may say the plan would take every term:
            # score every candidate, counting df in the same query (no statistics
            # statement), exact either way
            sql, params = (
                one_term_sql(self.database, spec, stats, k)
                if len(spec.words) == 1
                else score_sql(self.database, spec, None, stats, spec.words, k)
            )
            best = await self.engine.rows(sql, params)
            dfs = _ints(best[0][7]) if best else []
            if spec.thread_id is None and len(spec.words) == 1:
                self._hint(
                    spec,
                    {
                        spec.words[0]: single_term_stats(
                            dfs[0] if dfs else 0, [float(str(r[3])) for r in best], n_docs
                        )
                    },
                )
        else:
            best, dfs = await self._pruned_best(spec, stats, k)
        return [
            (
                str(t),
                int(str(o)),
                int(str(ms)),
                float(str(sc)),
                _ints(tf),
                int(str(ln)),
                [_ints(p) for p in _lists(pos)],
            )
            for t, o, ms, sc, tf, ln, pos, *_ in best
        ], dfs

    def _plans_every_term(self, spec: SearchSpec, n_docs: float, avg_len: float, k: int) -> bool:
        """Whether every query term has a hint and, by them, the plan would take every term
        (:func:`~.ranking.every_term_essential`)."""
        hints = {}
        for w in spec.words:
            hint = self._term_hints.get((spec.account_id, spec.agent_id, w))
            if hint is None:
                return False
            hints[w] = hint
        return every_term_essential(spec.words, hints, n_docs, avg_len, BM25_K1, BM25_B, k)

    def _hint(self, spec: SearchSpec, stats: dict[str, TermStats]) -> None:
        """Keep the statistics a search over all threads saw (terms held by no visible
        message as df 0) as hints for the next plan."""
        if len(self._term_hints) > TERM_HINTS_SIZE:
            self._term_hints.clear()
        for w in spec.words:
            self._term_hints[(spec.account_id, spec.agent_id, w)] = stats.get(
                w, TermStats(0, 0, 0, 0.0)
            )

    async def _pruned_best(
        self, spec: SearchSpec, stats: tuple[float, float], k: int
    ) -> tuple[list[Row], list[int]]:
        """BM25's best ``k`` over all threads with max-score pruning, and the query terms'
        document frequencies: the terms' exact statistics, then the scoring with the
        planned essential prefix (:func:`~.ranking.plan`), once more with a longer prefix
        when :func:`~.ranking.exact_with` says the result could miss a message."""
        n_docs, avg_len = stats
        sql, params = term_stats_sql(self.database, spec, avg_len)
        term_stats = {
            str(t): TermStats(int(str(df)), int(str(tf)), int(str(ln)), float(str(top)))
            for t, df, tf, ln, top in await self.engine.rows(sql, params)
        }
        self._hint(spec, term_stats)
        order = rarest_first(spec.words, term_stats)
        if not order:
            return [], []
        dfs = [term_stats[w].df if w in term_stats else 0 for w in spec.words]
        bounds = {w: impact_bound(term_stats[w], n_docs, avg_len, BM25_K1, BM25_B) for w in order}
        essential = plan(order, term_stats, bounds, k, n_docs)
        while True:
            sql, params = score_sql(self.database, spec, dfs, stats, essential, k)
            best = await self.engine.rows(sql, params)
            kth_score = float(str(best[k - 1][3])) if len(best) >= k else None
            retry = exact_with(order, len(essential), bounds, kth_score)
            if not retry:
                return best, dfs
            essential = order[:retry]

    async def lexical_search(self, spec: SearchSpec) -> list[SearchHit]:
        """BM25 with the proximity bonus only (the whole search without a dense side).

        Three steps over the posting lists (:mod:`.postings`, rules in :mod:`.ranking`): the
        query terms' exact statistics (not for one thread or up to two words:
        :func:`~.ranking.scores_directly`); BM25's best :data:`RERANK_WINDOW`, reading the
        common terms' postings only for the messages holding a rarer term when that is
        exact (max-score pruning; otherwise once more with more terms); the proximity
        bonus over those and the final order. Then the text of the rows returned."""
        n_docs, avg_len = await self.collection_stats(spec.account_id, spec.agent_id)
        k = max(RERANK_WINDOW, spec.limit)
        index = self.lexical_index()
        texts: dict[tuple[str, int], StoredMessage] = {}
        if index is not None and not index.filling:
            candidates, dfs = await self._index_best(index, spec, (n_docs, avg_len), k, texts)
        elif index is None or await self._has_postings():
            candidates, dfs = await self._posting_best(spec, (n_docs, avg_len), k)
        else:  # a lost or interrupted index of a database without posting lists
            raise StoreUnavailable(
                "transcript search: the lexical index of this agent's messages is being "
                "filled from the stored rows (after it was lost or interrupted); retry shortly"
            )
        ranked = rerank(
            spec.words,
            candidates,
            PROXIMITY_WINDOW,
            PROXIMITY_BOOST,
            spec.limit,
        )
        if not ranked:
            return []
        # the text of the rows returned only: stored with the lexical index's documents, or
        # read from ClickHouse (the posting lists hold none)
        keys = [(r.thread_id, r.offset) for r in ranked]
        if not all(key in texts for key in keys):
            texts.update(
                ((str(t), int(str(o))), StoredMessage(str(mid), str(role), str(content)))
                for t, mid, o, role, content, _ms in await self._text_at(spec, keys)
            )
        out = []
        for r in ranked:
            record = texts.get((r.thread_id, r.offset))
            if record is None:  # erased between the two queries
                continue
            explain: dict[str, object] | None = None
            if spec.explain:
                explain = {
                    "bm25": round(r.bm25, 6),
                    "proximity": round(r.proximity, 6),
                    "terms": {
                        t: {"tf": f, "df": d}
                        for t, f, d in zip(spec.words, r.tf, dfs, strict=False)
                    },
                    "length": r.length,
                    "average_length": round(max(avg_len, 1.0), 3),
                    "messages": int(n_docs),
                }
            out.append(
                SearchHit(
                    thread_id=r.thread_id,
                    message_id=record.message_id,
                    offset=r.offset,
                    role=record.role,
                    content=record.content,
                    created_at=datetime.fromtimestamp(r.created_ms / 1000, tz=UTC),
                    relevance=r.relevance,
                    explain=explain,
                )
            )
        return out

    async def _text_at(self, spec: SearchSpec, keys: Sequence[tuple[str, int]]) -> list[Row]:
        """Rows thread_id, message_id, offset, role, content, created_ms of the agent's
        messages at ``keys`` (one per key found): point reads from ``message_text``, or a
        key-set read of ``messages`` where that table is not there."""
        if await self._has_text():
            return await self.engine.rows(
                text_by_key_sql(self.database),
                {
                    "account_id": spec.account_id,
                    "agent_id": spec.agent_id,
                    "keys": [text_key(spec.account_id, spec.agent_id, t, o) for t, o in keys],
                },
            )
        return await self.engine.rows(
            messages_by_key_sql(self.database, terms=False),
            {
                "account_id": spec.account_id,
                "agent_id": spec.agent_id,
                "thread_ids": [t for t, _ in keys],
                "offsets": [o for _, o in keys],
            },
        )

    async def thread_visible(
        self, account_id: str, agent_id: str, thread_id: str, user_id: str | None
    ) -> bool:
        """Whether ``user_id`` (None: no authenticated user) may see the thread."""
        rows = await self.engine.rows(
            thread_visible_sql(self.database),
            {
                "account_id": account_id,
                "agent_id": agent_id,
                "thread_id": thread_id,
                "user_id": user_id or "",
            },
        )
        return bool(rows) and str(rows[0][0]) in {"1", "true", "True"}

    async def thread_row_counts(
        self, account_id: str, agent_id: str, thread_id: str
    ) -> tuple[int, int]:
        """(stored rows, distinct offsets) of one thread: equal once duplicates merged."""
        rows = await self.engine.rows(
            count_sql(self.database),
            {"account_id": account_id, "agent_id": agent_id, "thread_id": thread_id},
        )
        return int(str(rows[0][0])), int(str(rows[0][1]))

    # --- erasure -------------------------------------------------------------------------------
    async def erase_thread(self, account_id: str, agent_id: str, thread_id: str) -> int:
        """Delete every row of one thread (messages, postings, vectors, owners),
        synchronously; returns the message rows that were stored. Idempotent."""
        return await self.erase_threads([(account_id, agent_id, thread_id)])

    async def erase_threads(
        self, threads: Sequence[tuple[str, str, str]], *, purge: bool = False
    ) -> int:
        """:meth:`erase_thread` for many (account, agent, thread) triples: one mutation per
        table for each :data:`ERASE_CHUNK` threads, not one per thread and table (a user's
        erasure of 100 threads ran 400 mutations, each rewriting the parts it touched).
        Returns the message rows that were stored. Idempotent.

        Where a delete only marks (the lexical index, the vector index's shards), the index
        is then purged of the erased bytes if this call deleted something there, or always
        with ``purge`` (a resumed erasure: an earlier run may have deleted and stopped
        before its purge)."""
        stored = 0
        unique = list(dict.fromkeys(threads))
        rewrite = [v for v in self._vector_indexes() if await v.delete_threads(unique) or purge]
        index = self.lexical_index()
        indexed = 0
        if index is not None:  # filled or filling (a fill reads what is left)
            indexed = await index.delete_threads([ThreadRef(a, g, t).key for a, g, t in unique])
        # the text table whenever it is there, filled or filling; the posting lists too
        has_text, has_postings = await self._tables(TEXT_TABLE, POSTINGS_TABLE)
        tables = ["messages", "message_vectors", "thread_users"]
        if has_postings:
            tables.insert(1, POSTINGS_TABLE)
        for i in range(0, len(unique), ERASE_CHUNK):
            chunk = unique[i : i + ERASE_CHUNK]
            found = await self.engine.rows(thread_keys_sql(self.database, chunk), {})
            stored += sum(int(str(r[4])) for r in found)
            if has_text:  # first: its keys are read from the messages still there
                await self._erase_text(
                    [text_key(str(a), str(g), str(t), int(str(o))) for a, g, t, o, _ in found]
                )
            for table in tables:
                await self.engine.command(erase_threads_sql(self.database, table, chunk))
        # deletes mark; these take the erased text off the disk (docs/owning-memory.md)
        if index is not None and (indexed or purge):
            await index.purge()
        for vectors in rewrite:  # and the erased vectors
            await vectors.rewrite()
        if has_text and stored:  # RocksDB keeps a deleted value until a compaction drops it
            await self.engine.command(optimize_sql(self.database, TEXT_TABLE))
        return stored

    async def _erase_text(self, keys: Sequence[str]) -> None:
        """Delete the texts at ``keys`` from ``message_text``, the keys read from ``messages``
        (so before them): point deletes, where a condition on the threads scans the whole
        table (2-3 s per mutation at 1M messages, 5 ms for 100 keys). A rerun of an
        interrupted erasure finds the same keys while the messages are there."""
        for i in range(0, len(keys), ERASE_KEYS):
            await self.engine.command(text_delete_sql(self.database, keys[i : i + ERASE_KEYS]))

    async def threads_of_user(self, account_id: str, user_id: str) -> list[tuple[str, str]]:
        """(agent, thread) of every thread of the account the user wrote in."""
        rows = await self.engine.rows(
            f"SELECT DISTINCT agent_id, thread_id FROM {self.database}.thread_users "
            "WHERE account_id = {account_id:String} AND user_id = {user_id:String} "
            "ORDER BY agent_id, thread_id",
            {"account_id": account_id, "user_id": user_id},
        )
        return [(str(r[0]), str(r[1])) for r in rows]

    def _vector_indexes(self) -> list[DenseIndex]:
        """This database's vector indexes, one per model that has a directory."""
        if self.vector_root is None:
            return []
        root = self.vector_root / self.database
        if not root.is_dir():
            return []
        return [
            open_vector_index(p, process=self.vector_process)
            for p in sorted(root.iterdir())
            if p.is_dir()
        ]

    async def close(self) -> None:
        """Commit and close the lexical and vector indexes under this store's roots (the
        engine is closed by its owner)."""
        # retags searches asked for: the next search to meet such a thread asks again
        for task in list(self._repairs):
            task.cancel()
        await asyncio.gather(*self._repairs, return_exceptions=True)
        if self.index_root is not None:
            await close_indexes(self.index_root)
        if self.vector_root is not None:
            await close_vector_indexes(self.vector_root)

    async def drop_index(self, database: str) -> None:
        """Delete ``database``'s lexical and vector indexes (a dropped or rebuilt
        generation's)."""
        if self.index_root is not None:
            await drop_index(self.index_root / database)
        if self.vector_root is not None:
            await drop_vector_indexes(self.vector_root / database)

    async def optimize(self) -> None:
        """Force merges now (collapses duplicates on disk). For operators and tests; search
        never depends on it."""
        await self.engine.command(f"OPTIMIZE TABLE {self.database}.messages FINAL")
        (has_postings,) = await self._tables(POSTINGS_TABLE)
        if has_postings:
            await self.engine.command(f"OPTIMIZE TABLE {self.database}.{POSTINGS_TABLE} FINAL")
        await self.engine.command(f"OPTIMIZE TABLE {self.database}.thread_users FINAL")


def _query_weight(hits: Sequence[SearchHit]) -> float:
    """The query's total idf from BM25's explain parts (the same for every hit: document
    frequencies are counted over all candidates); 0 without hits."""
    if not hits or hits[0].explain is None:
        return 0.0
    parts = hits[0].explain
    terms = parts["terms"]
    assert isinstance(terms, dict)
    n_docs = parts["messages"]
    assert isinstance(n_docs, int)
    return query_weight(float(n_docs), [float(t["df"]) for t in terms.values()])


def _no_lexical_parts() -> dict[str, object]:
    """The BM25 parts of a message found by the dense side only."""
    return {"bm25": 0.0, "proximity": 0.0, "terms": {}}


NOBODY: Final[frozenset[str]] = frozenset()
"""The users of a thread without any."""


def _index_columns(
    messages: pa.Table, readers: Mapping[tuple[str, str, str], frozenset[str]]
) -> IndexColumns:
    """A parsed batch's rows (:data:`~.rows.MESSAGES_SCHEMA`) as lexical index columns
    (made Python values and analyzed on the index's thread), with each thread's users."""
    col = messages.column
    return IndexColumns(
        col("account_id"),
        col("agent_id"),
        col("thread_id"),
        col("offset"),
        pc.cast(col("created_at"), pa.int64()),
        col("content"),
        col("message_id"),
        col("role"),
        readers,
    )


def _first_copies(table: pa.Table) -> pa.Table:
    """The rows of ``table`` (in key order) whose key (account, agent, thread, offset)
    differs from the row before: a message's unmerged copies are adjacent. A fill's step
    starts after the previous step's last key, so its first row is never a copy."""
    if table.num_rows < 2:
        return table
    same: Any = None
    for c in ("account_id", "agent_id", "thread_id", "offset"):
        col = table.column(c)
        eq = pc.equal(col.slice(1), col.slice(0, table.num_rows - 1))
        same = eq if same is None else pc.and_(same, eq)
    keep = pa.concat_arrays([pa.array([True]), pc.invert(same).combine_chunks()])
    return table.filter(keep)


def _triples(table: pa.Table) -> list[tuple[str, str, str]]:
    """The distinct (account, agent, thread) of a table's rows."""
    if not table.num_rows:
        return []
    cols = [table.column(c).to_pylist() for c in ("account_id", "agent_id", "thread_id")]
    return list(dict.fromkeys(zip(*cols, strict=True)))


def _strings(value: object) -> list[str]:
    """An Array(String) from the engine (a list) as strs."""
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    raise PermanentInfraError(f"expected an array of strings, got {type(value).__name__}")


def _lists(value: object) -> list[object]:
    """An Array(Array(...)) from the engine as a list of its elements."""
    if isinstance(value, list | tuple):
        return list(value)
    raise PermanentInfraError(f"expected an array, got {type(value).__name__}")


def _ints(value: object) -> list[int]:
    """An Array(UInt64) from the engine (a list, or its text form) as ints."""
    if isinstance(value, list | tuple):
        return [int(str(v)) for v in value]
    text = str(value).strip("[]")
    return [int(v) for v in text.split(",") if v.strip()]


def _vouched(parsed: pa.Table | None) -> pa.Table | None:
    """``parsed``, or None when a record needs the Python path."""
    if parsed is None or pc.any(pc.equal(parsed.column("kind"), KIND_PYTHON)).as_py():
        return None
    return parsed
