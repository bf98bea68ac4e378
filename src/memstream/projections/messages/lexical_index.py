"""The transcript's lexical index: Tantivy, beside ClickHouse, for the BM25 side of search.

ClickHouse stays the record (messages, their text, thread owners, vectors, and the posting
lists a ClickHouse server deployment searches). With embedded chdb, every stored message is
also a document of a Tantivy index in ``<root>/<database>`` (one per generation), holding
its analyzed terms (the project's analyzer, :mod:`memstream.projections.analyzer`) with
their positions, its tenancy ids, its key, and (stored, not indexed) its id, role and text:
a search reads its hits from here, never from ClickHouse (whose one worker thread the
projector's inserts share), and scores the dense side's candidates from their stored terms
(:meth:`LexicalIndex.documents`). A search asks Tantivy for its best
:data:`CANDIDATES` (a block-max WAND over the posting lists, in Rust, no SQL to plan) and
re-scores them with the project's own statistics (df over what the caller may see, the
agent's message count and average length), so scores never carry a statistic of text the
caller may not read (docs/transcript-search.md, "Who sees what").

Who may read a document is in the document: its ``readers`` terms (:func:`reader_tags`:
``p`` for a thread without users, ``u:<user>`` for each user of a private one, as
``thread_users`` holds them), so a search keeps what its caller may read with one more
posting list instead of excluding the hidden threads' keys (a term set of 1,000 thread
keys is rebuilt on every one of a search's 3-4 searches: half of BM25's time at 1M).

Guarantees:

- :meth:`LexicalIndex.upsert` is idempotent (delete by key, then add): a redelivered or
  replayed batch leaves one document per message. Durable and visible on return (committed,
  searcher reloaded), except in a replay's load (:meth:`LexicalIndex.defer_commits`), which
  the seal commits once.
- :meth:`LexicalIndex.best` is exact -- the same rows, scores and order as scoring every
  visible match -- when the matches are at most :data:`CANDIDATES`; beyond that the best
  ``k`` of Tantivy's best :data:`CANDIDATES` (its own BM25: the same formula with df over
  every document), re-scored exactly (measured at 1M: the same relevance at every rank for
  200 of 200 queries, ``bench/lexical_engines.py``).
- One writer per directory (Tantivy's lock): indexes are opened once per path per process
  (:func:`open_index`), and every write runs on the index's own thread; searches run on
  :data:`READ_THREADS` threads of their own, on the searcher of the last commit (a write
  returns once committed and reloaded, so a search started after it sees it).
- Erased text leaves the disk: a delete only marks documents in a bitset, and their text
  (stored record, terms, positions) stays in their segments' files until a merge rewrites
  them, which for a large segment may never come. :meth:`LexicalIndex.purge` (run by an
  erasure after the delete) rewrites every live document, so each older segment ends
  wholly deleted, is dropped at the commit, and its files are removed.
- An index of an older layout (:data:`LAYOUT`, in the directory's ``layout`` file) is
  emptied when opened and filled again from ClickHouse, like a lost one.
- Every document of a thread carries the thread's readers as of its last write:
  :meth:`LexicalIndex.retag` (called for each thread a batch gives an owner, before the
  batch's messages are added) rewrites a thread's documents whose readers differ, on the
  writer's thread, from what the index holds (so a retry after a crash repairs what a lost
  retag left); while the index is filling it is queued and applied before the fill ends.
  A search still checks its candidates against the caller's hidden threads and, should
  one slip through, searches again with them excluded by key (:attr:`IndexResult.stale`).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import logging
import math
import re
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

import orjson
import pyarrow as pa

from memstream.projections.analyzer import stem
from memstream.projections.messages.fusion import idf
from memstream.projections.messages.text_table import text_key
from memstream.projections.shared_runs import SharedRuns
from memstream.schemas.records import ThreadRef

T = TypeVar("T")
log = logging.getLogger(__name__)

CANDIDATES: Final = 300
"""Tantivy hits re-scored per search: 3x the ranking window (measured enough at 1M)."""
FILLING: Final = "filling"
"""A marker file in an index directory: the index is being (or waits to be) filled from
ClickHouse; writes skip it, and searches use the posting lists meanwhile where the database
still has them (else they answer "unavailable, retry": ``MessageStore.lexical_search``)."""
WRITER_HEAP: Final = 64_000_000
"""The writer's memory budget per indexing thread (Tantivy flushes a segment when full)."""
FILL_THREADS: Final = 2
RETAG_PAGE: Final = 1_000
"""Documents of a thread a retag reads at a time (a long thread's stay off the heap)."""
PURGE_STEP: Final = 5_000
"""Documents a purge (:meth:`LexicalIndex.purge`) rewrites per call on the writer's thread
(a thread's documents are never split): the projector's writes wait at most one step,
~0.1 s (20,000: 0.55 s for 1.4x less time in all; ``bench/index_purge.py``)."""
PURGE_COLLECT_WAIT_S: Final = 120.0
"""How long a purge waits for the merges in flight to let go of the older segments' files."""
READ_THREADS: Final = 2
"""Threads searching the index (beside its one writer thread): a search never waits for a
commit of the projector's batch (~12 ms) or for another search."""
_TOKEN: Final = re.compile(r"[^\x00-\x2f\x3a-\x40\x5b-\x60\x7b-\x7f]+")
"""A token: a run of what :func:`~memstream.projections.analyzer.tokens` does not split on."""
LAYOUT: Final = 3
"""The documents' layout: 2 added the stored ``record`` (id, role, text), 3 the
``readers``. An index written with another is emptied at open and filled again."""
PUBLIC: Final = "p"
"""The reader tag of a thread without users (anyone in the agent may read it); a user's tag
is ``u:<user_id>``, so no user id can be mistaken for it."""
_LAYOUT_FILE: Final = "layout"
_SEP: Final = "\x1f"
"""Between a stored record's id, role and text (ids and roles never hold it; the text is
last, so it may)."""
_STEMS: dict[str, str] = {}
_STEMS_MAX: Final = 500_000


@dataclass(frozen=True, slots=True)
class IndexRow:
    """One message as the index holds it."""

    account_id: str
    agent_id: str
    thread_id: str
    offset: int
    created_ms: int
    content: str
    body: str | None = None
    """The terms already analyzed and joined by spaces (ClickHouse's ``terms``, read by a
    fill); None: analyzed here from ``content`` (:func:`document_terms`, the same
    analysis)."""
    message_id: str = ""
    role: str = ""
    readers: frozenset[str] = frozenset()
    """The thread's users (``thread_users``); empty: a thread without users."""

    @property
    def key(self) -> str:
        """The message's key (``account/agent/thread/offset``; ids never hold ``/``)."""
        return text_key(self.account_id, self.agent_id, self.thread_id, self.offset)


_Item = tuple[str, str, str, int, int, str, "str | None", str, str, frozenset[str]]
"""What :meth:`LexicalIndex._add` reads of a message: account, agent, thread, offset,
created_ms, content, body, message id, role, the thread's users."""


@dataclass(frozen=True, slots=True)
class IndexColumns:
    """A batch of messages to index as Arrow columns (a parsed batch's), with each thread's
    users: what :class:`IndexRow` holds, without an object per message. The columns become
    Python values on the index's thread (:meth:`items`), not on the caller's event loop
    (building 10,000 rows there took ~40 ms of a replay's batch, in a profile)."""

    account_id: pa.Array | pa.ChunkedArray
    agent_id: pa.Array | pa.ChunkedArray
    thread_id: pa.Array | pa.ChunkedArray
    offset: pa.Array | pa.ChunkedArray
    created_ms: pa.Array | pa.ChunkedArray
    content: pa.Array | pa.ChunkedArray
    message_id: pa.Array | pa.ChunkedArray
    role: pa.Array | pa.ChunkedArray
    readers: Mapping[tuple[str, str, str], frozenset[str]]
    """(account, agent, thread) -> the thread's users; a thread not in it has none."""
    body: pa.Array | pa.ChunkedArray | None = None
    """The terms already analyzed and joined by spaces (ClickHouse's ``terms``, read by a
    fill); None: analyzed on the index's thread (:func:`document_body`)."""

    def __len__(self) -> int:
        return len(self.account_id)

    def items(self) -> Iterator[_Item]:
        """Each message as :meth:`LexicalIndex._add` reads it (body None: analyzed there)."""
        readers, nobody = self.readers, frozenset[str]()
        cols = (
            self.account_id,
            self.agent_id,
            self.thread_id,
            self.offset,
            self.created_ms,
            self.content,
            self.message_id,
            self.role,
        )
        bodies = self.body.to_pylist() if self.body is not None else [None] * len(self)
        for a, g, t, o, ms, content, mid, role, body in zip(
            *(c.to_pylist() for c in cols), bodies, strict=True
        ):
            yield a, g, t, o, ms, content, body, mid, role, readers.get((a, g, t), nobody)

    def keys(self) -> list[str]:
        return [
            text_key(a, g, t, o)
            for a, g, t, o in zip(
                self.account_id.to_pylist(),
                self.agent_id.to_pylist(),
                self.thread_id.to_pylist(),
                self.offset.to_pylist(),
                strict=True,
            )
        ]


def _items(rows: Iterable[IndexRow] | IndexColumns) -> Iterator[_Item]:
    if isinstance(rows, IndexColumns):
        return rows.items()
    return (
        (
            r.account_id,
            r.agent_id,
            r.thread_id,
            r.offset,
            r.created_ms,
            r.content,
            r.body,
            r.message_id,
            r.role,
            r.readers,
        )
        for r in rows
    )


@dataclass(frozen=True, slots=True)
class IndexQuery:
    """A search of the index: ``words`` (analysed) in the account and agent, or in
    ``thread_id``, by ``user_id`` (``""``: no user); never in the threads at ``hidden``
    thread keys (those the caller may not read: :func:`reader_tags` keep them out, the keys
    check it), nor in the threads at ``excluded`` thread keys (deleted threads, whatever
    their readers: kept out by key); scored with the agent's ``stats`` (messages, average
    length) and ``bm25`` (k1, b); the best ``k``."""

    account_id: str
    agent_id: str
    thread_id: str | None
    words: Sequence[str]
    hidden: Sequence[str]
    stats: tuple[float, float]
    k: int
    bm25: tuple[float, float]
    user_id: str
    excluded: Sequence[str] = ()


@dataclass(frozen=True, slots=True)
class IndexHit:
    """One re-scored candidate: the columns the scoring statements return, and its stored
    record."""

    thread_id: str
    offset: int
    created_ms: int
    bm25: float
    tf: tuple[int, ...]
    length: int
    positions: tuple[tuple[int, ...], ...]
    record: StoredMessage


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A document's stored message: what a search hit shows."""

    message_id: str
    role: str
    content: str


@dataclass(frozen=True, slots=True)
class IndexDoc:
    """One message read back by key (:meth:`LexicalIndex.documents`)."""

    thread_id: str
    offset: int
    created_ms: int
    terms: list[str]
    record: StoredMessage


def _pack(message_id: str, role: str, content: str) -> bytes:
    return f"{message_id}{_SEP}{role}{_SEP}{content}".encode()


def _unpack(doc: Any) -> StoredMessage:
    message_id, role, content = bytes(doc.get_first("record")).decode().split(_SEP, 2)
    return StoredMessage(message_id, role, content)


# A document is handed to Tantivy as JSON (``IndexWriter.add_json``: parsed against the
# schema in Rust), built by the two functions below for writes, fills and retags alike, so
# a new field cannot reach one and miss another. Measured per message: 5.6 µs against 7.3
# for a ``Document`` built by ten ``add_*`` calls then added.


def _thread_fields(
    thread_key: str, account_id: str, agent_id: str, thread_id: str, tags: Sequence[str]
) -> str:
    """The opening of the JSON document of every message of a thread: its fields that are
    the thread's (every field of :func:`_schema` is in this or :func:`_document_of`)."""
    fields = orjson.dumps(
        {
            "thread_key": thread_key,
            "account_id": account_id,
            "agent_id": agent_id,
            "thread_id": thread_id,
            "readers": list(tags),
        }
    )
    return fields[:-1].decode() + ","


def _document_of(
    head: str, key: str, offset: int, created_ms: int, body: str, record: bytes
) -> str:
    """A message's JSON document: the thread's ``head`` (:func:`_thread_fields`), then the
    message's own fields (``record`` as Tantivy reads a bytes field: base64)."""
    own = orjson.dumps(
        {
            "key": key,
            "offset": offset,
            "created_ms": created_ms,
            "body": body,
            "record": base64.b64encode(record).decode(),
        }
    )
    return head + own[1:].decode()


@dataclass(frozen=True, slots=True)
class IndexResult:
    hits: list[IndexHit]
    dfs: list[int]
    exact: bool
    """Whether every visible match was re-scored (at most :data:`CANDIDATES`)."""
    stale: tuple[str, ...] = ()
    """Ids of hidden threads whose documents the readers let through (their retag was lost):
    the result was searched again with them excluded by key; the caller retags them."""


def reader_tags(users: Iterable[str]) -> list[str]:
    """The ``readers`` terms of a thread with ``users`` (none: :data:`PUBLIC`)."""
    tags = sorted(f"u:{u}" for u in users)
    return tags or [PUBLIC]


def document_terms(text: str) -> list[str]:
    """:func:`memstream.projections.analyzer.terms`, with the stems cached (a Zipf
    vocabulary: ~5 µs a message instead of 68; the same terms, tested): the tokens are the
    runs between the analyzer's separators, found in one pass."""
    words = _TOKEN.findall(text.lower())
    try:
        return list(map(_STEMS.__getitem__, words))
    except KeyError:
        if len(_STEMS) >= _STEMS_MAX:
            _STEMS.clear()
        return [
            s if (s := _STEMS.get(w)) is not None else _STEMS.setdefault(w, stem(w)) for w in words
        ]


def document_body(text: str) -> str:
    """The ``body`` field of a message with ``text``: its :func:`document_terms` joined by
    spaces (no term holds one)."""
    return " ".join(document_terms(text))


def _schema() -> Any:
    import tantivy

    sb = tantivy.SchemaBuilder()
    sb.add_text_field("key", tokenizer_name="raw", index_option="basic")
    sb.add_text_field("thread_key", tokenizer_name="raw", index_option="basic")
    sb.add_text_field("account_id", tokenizer_name="raw", index_option="basic")
    sb.add_text_field("agent_id", tokenizer_name="raw", index_option="basic")
    sb.add_text_field("thread_id", tokenizer_name="raw", index_option="basic", stored=True)
    sb.add_unsigned_field("offset", stored=True)
    sb.add_integer_field("created_ms", stored=True, fast=True)
    # the terms joined by spaces (no term holds an ASCII space: it separates), split back
    # on spaces only, so Tantivy's terms and positions are the analyzer's
    sb.add_text_field("body", stored=True, tokenizer_name="terms", index_option="position")
    sb.add_bytes_field("record", stored=True, indexed=False)  # _pack: id, role, text
    # who may read it: reader_tags of the thread's users (stored: a retag compares them)
    sb.add_text_field("readers", tokenizer_name="raw", index_option="basic", stored=True)
    return sb.build()


class LexicalIndex:
    """The Tantivy index of one database's messages, at ``path``."""

    def __init__(self, path: Path) -> None:
        import tantivy

        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        layout = path / _LAYOUT_FILE
        if (path / "meta.json").exists() and (
            not layout.exists() or layout.read_text().strip() != str(LAYOUT)
        ):  # written with another layout: emptied, and filled again below
            shutil.rmtree(path)
            path.mkdir(parents=True)
        fresh = not (path / "meta.json").exists()
        self._tantivy = tantivy
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tantivy")
        self._reads = ThreadPoolExecutor(
            max_workers=READ_THREADS, thread_name_prefix="tantivy-read"
        )
        # newest first inside a segment: documents of equal score come back newest first
        self._index = tantivy.Index(
            _schema(),
            path=str(path),
            reuse=True,
            sort_by_field="created_ms",
            sort_order=tantivy.Order.Desc,
        )
        # ``body`` is the analyzer's terms joined by spaces, and no term holds ASCII
        # whitespace (every such character is an analyzer separator, here and in
        # ClickHouse's ``splitByNonAlpha``), so Tantivy's whitespace tokenizer (which splits
        # on ASCII whitespace only) gives back exactly the terms and their positions: the
        # same tokens as the ``[^ ]+`` regex tokenizer it replaced, at ~5 µs less a message
        # (tests/unit/test_lexical_terms.py; no layout change: indexes written before read
        # the same)
        self._index.register_tokenizer(
            "terms", tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.whitespace()).build()
        )
        self._schema = self._index.schema
        self._writer: Any = None
        self._writer_threads = 0
        self._closed = False
        self.deferred = False
        #: Keep a caller's hidden threads out by the documents' readers (False: by their
        #: thread keys alone, as before layout 3; benches compare the two).
        self.by_readers = True
        # thread key -> reader tags of the documents added since the last commit (a
        # searcher does not see them yet; retag reads them through a commit when they differ)
        self._uncommitted: dict[str, list[str]] = {}
        # thread key -> (account, agent, thread, users): retags asked while filling
        self._retags: dict[str, tuple[str, str, str, frozenset[str]]] = {}
        self._purge_after_fill = False
        self._purges: SharedRuns[int] = SharedRuns()
        if fresh:  # not filled yet: the messages already stored come first
            self.mark_filling()
            layout.write_text(f"{LAYOUT}\n")

    # --- plumbing --------------------------------------------------------------------------

    async def _run(self, fn: Callable[[], T]) -> T:
        """``fn`` on the writer's thread (writes, commits, fills: one at a time)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    async def _read(self, fn: Callable[[], T]) -> T:
        """``fn`` on a reader thread: searches read a searcher of the last commit, beside
        the writer and each other (Tantivy's search releases the GIL)."""
        return await asyncio.get_running_loop().run_in_executor(self._reads, fn)

    def _w(self, threads: int = 1) -> Any:
        """The writer: one indexing thread for the live batches (a commit flushes one
        segment: 12 ms for 50 messages against 25 with two), two for a fill."""
        if self._writer is not None and self._writer_threads != threads:
            self._writer.commit()
            self._writer.wait_merging_threads()
            self._writer = None  # dropped: its directory lock goes with it
        if self._writer is None:
            self._writer = self._index.writer(heap_size=WRITER_HEAP * threads, num_threads=threads)
            self._writer_threads = threads
        return self._writer

    @property
    def filling(self) -> bool:
        return (self.path / FILLING).exists()

    def mark_filling(self) -> None:
        (self.path / FILLING).touch()

    def _clear_filling(self) -> None:
        (self.path / FILLING).unlink(missing_ok=True)

    # --- writes ----------------------------------------------------------------------------

    def _add(
        self, rows: Iterable[IndexRow] | IndexColumns, *, replace: bool = True, threads: int = 1
    ) -> int:
        """Add ``rows``; ``replace``: after deleting any document of their keys, with one
        term-set delete stamped before the adds (a fill into an emptied index has none to
        delete). A key twice in ``rows`` is added once, its last copy."""
        w = self._w(threads)
        # (account, agent, thread) -> its users and the opening of its documents: a batch
        # interleaves its threads' messages (one conversation's turns among the others')
        heads: dict[tuple[str, str, str], tuple[frozenset[str], str]] = {}
        # key -> its document (None: no terms, nothing to index); a key met twice keeps
        # its last copy, as a delete before each add would
        docs: dict[str, str | None] = {}
        for a, g, t, offset, created_ms, content, terms, message_id, role, users in _items(rows):
            known = heads.get((a, g, t))
            if known is not None and known[0] == users:
                head = known[1]
            else:
                thread_key = ThreadRef(a, g, t).key
                tags = reader_tags(users)
                self._uncommitted[thread_key] = tags
                head = _thread_fields(thread_key, a, g, t, tags)
                heads[(a, g, t)] = (users, head)
            key = text_key(a, g, t, offset)
            body = document_body(content) if terms is None else terms
            if not body:  # matches nothing: nothing to index
                docs[key] = None
                continue
            record = _pack(message_id, role, content)
            docs[key] = _document_of(head, key, offset, created_ms, body, record)
        if replace and docs:
            # one delete of every key, stamped before the adds below (Tantivy deletes only
            # the documents added before a delete): ~3 µs a message less than a delete by
            # term per message
            w.delete_documents_by_query(
                self._tantivy.Query.term_set_query(self._schema, "key", list(docs))
            )
        n = 0
        for doc in docs.values():
            if doc is not None:
                w.add_json(doc)
                n += 1
        return n

    def _commit(self, threads: int = 1) -> None:
        self._w(threads).commit()
        self._index.reload()
        self._uncommitted.clear()

    async def upsert(self, rows: Sequence[IndexRow] | IndexColumns) -> int:
        """Index ``rows`` (replacing any document of the same message); committed and
        searchable on return, unless :meth:`defer_commits` holds them for :meth:`flush`.
        Returns the documents added (messages with terms)."""
        if not rows or self.filling:
            return 0

        def go() -> int:
            n = self._add(rows)
            if not self.deferred:
                self._commit()
            return n

        return await self._run(go)

    async def retag(self, threads: Sequence[tuple[str, str, str, frozenset[str]]]) -> int:
        """Give every document of each (account, agent, thread, users) the readers of those
        users, where the index holds others (a thread that gained a user: its documents so
        far were tagged public, or without that user). Runs before the batch that gave them
        owners adds its messages; a no-op for threads already tagged so (a redelivery) and
        for threads without documents. While the index is filling, queued for the fill's
        end. Returns the documents rewritten."""
        if not threads:
            return 0
        return await self._run(lambda: self._retag(threads))

    def _retag(
        self, threads: Iterable[tuple[str, str, str, frozenset[str]]], *, queue: bool = True
    ) -> int:
        if queue and self.filling:
            for account_id, agent_id, thread_id, users in threads:
                key = ThreadRef(account_id, agent_id, thread_id).key
                queued = self._retags.get(key)
                known = queued[3] if queued else frozenset()  # owners only grow
                self._retags[key] = (account_id, agent_id, thread_id, users | known)
            return 0
        wanted = {
            ThreadRef(a, g, t).key: (a, g, t, reader_tags(users)) for a, g, t, users in threads
        }
        if any(
            key in self._uncommitted and self._uncommitted[key] != tags
            for key, (_a, _g, _t, tags) in wanted.items()
        ):
            self._commit()  # their newest documents become readable, to be rewritten
        tv, schema = self._tantivy, self._schema
        searcher = self._index.searcher()
        w = self._w()
        n = 0
        Q, Occur = tv.Query, tv.Occur
        for key, (_a, _g, _t, tags) in wanted.items():
            of_thread = Q.term_query(schema, "thread_key", key)
            found = searcher.search(of_thread, 1, count=True)
            if not found.hits:
                continue
            # tagged right: holds every tag (owners only grow, so a document tagged before
            # holds "p" alone or fewer users, never more)
            tagged = Q.boolean_query(
                [(Occur.Must, of_thread)]
                + [(Occur.Must, Q.term_query(schema, "readers", t)) for t in tags]
            )
            if _count(searcher.search(tagged, 1, count=True)) == _count(found):
                continue
            total = _count(found)
            self._rewrite_thread(searcher, w, key, total, tags)
            self._uncommitted[key] = tags
            n += total
        if n and not self.deferred:
            self._commit()
        return n

    def _rewrite_thread(
        self, searcher: Any, w: Any, key: str, total: int, tags: Sequence[str] | None
    ) -> None:
        """Delete the ``total`` documents ``searcher`` holds of the thread at ``key`` and add
        them again from their stored fields, with the readers ``tags`` (None: each its own).
        The delete takes the documents added before it (the searcher's, read page by page
        from its snapshot), not those added after it."""
        account_id, agent_id, thread_id = key.split("/", 2)  # ids never hold "/"
        of_thread = self._tantivy.Query.term_query(self._schema, "thread_key", key)
        w.delete_documents_by_term("thread_key", key)
        heads: dict[tuple[str, ...], str] = {}
        for start in range(0, total, RETAG_PAGE):
            page = searcher.search(of_thread, RETAG_PAGE, count=False, offset=start).hits
            for _score, address in page:
                doc = searcher.doc(address)
                own = tuple(tags) if tags is not None else tuple(map(str, doc.get_all("readers")))
                head = heads.get(own)
                if head is None:
                    head = heads[own] = _thread_fields(key, account_id, agent_id, thread_id, own)
                offset = int(str(doc.get_first("offset")))
                w.add_json(
                    _document_of(
                        head,
                        text_key(account_id, agent_id, thread_id, offset),
                        offset,
                        int(str(doc.get_first("created_ms"))),
                        str(doc.get_first("body")),
                        bytes(doc.get_first("record") or b""),
                    )
                )

    def defer_commits(self) -> None:
        """A replay's load into an empty target: upserts add without committing (a commit
        costs ~70 ms a 10,000-message batch; nobody searches the target before its switch)
        until :meth:`flush`. A process that stops before it leaves them uncommitted, and
        the resumed replay fills the index again from its rows."""
        self.deferred = True

    async def flush(self) -> None:
        """Commit what :meth:`defer_commits` held; later upserts commit again."""
        if self.deferred:
            await self._run(self._commit)
            self.deferred = False

    async def fill(self, batches: Callable[[], Any]) -> int:
        """Replace the whole index with the rows of ``batches`` (an async iterator factory
        of :class:`IndexColumns` or :class:`IndexRow` lists, read from ClickHouse, one row
        per message, with their
        threads' users as read after the marker was set), under the filling marker: an
        interrupted fill runs again at the next start."""
        self.mark_filling()
        await self._run(lambda: self._w(FILL_THREADS).delete_all_documents())
        n = 0
        source = batches().__aiter__()
        # the next batch is read (ClickHouse's thread) while this one is added (the index's)
        ahead: asyncio.Future[IndexColumns | list[IndexRow]] = asyncio.ensure_future(anext(source))
        while True:
            try:
                rows = await ahead
            except StopAsyncIteration:
                break
            ahead = asyncio.ensure_future(anext(source))
            try:
                n += await self._run(
                    functools.partial(self._add, rows, replace=False, threads=FILL_THREADS)
                )
            except BaseException:
                ahead.cancel()
                raise
        await self._run(lambda: self._commit(FILL_THREADS))
        await self._run(lambda: self._w(1))  # back to the live writer
        await self._run(self._end_fill)
        if self._purge_after_fill:  # an erasure deleted documents this fill had added
            self._purge_after_fill = False
            await self.purge()
        return n

    def _end_fill(self) -> None:
        """The retags asked while filling (a thread that gained a user after the fill read
        its owners), then the marker goes: on the writer's thread, so a retag asked
        meanwhile is either queued before this or applied to the filled index after it."""
        queued = list(self._retags.values())
        self._retags.clear()
        self._retag(queued, queue=False)
        self._clear_filling()

    async def delete_keys(self, keys: Sequence[str]) -> None:
        """Delete the documents of the messages at ``keys`` (:attr:`IndexRow.key`)."""
        await self._delete("key", keys, count=False)

    async def delete_threads(self, keys: Sequence[str]) -> int:
        """Delete every document of the threads at ``keys``
        (:attr:`~memstream.schemas.records.ThreadRef.key`); how many there were. Their text
        stays in the segments' files until :meth:`purge`."""
        return await self._delete("thread_key", keys, count=True)

    async def _delete(self, field: str, values: Sequence[str], *, count: bool) -> int:
        """Delete the documents holding ``values`` in ``field``; with ``count``, how many
        there were (0 without: a rolled-back batch's keys need no search each)."""
        if not values:
            return 0

        def go() -> int:
            found = 0
            if count:
                if self._uncommitted:  # counted below, and in a file once committed
                    self._commit()
                searcher, Q = self._index.searcher(), self._tantivy.Query
                found = sum(
                    _count(searcher.search(Q.term_query(self._schema, field, v), 1, count=True))
                    for v in values
                )
            w = self._w()
            for v in values:
                w.delete_documents_by_term(field, v)
            self._commit()
            return found

        return await self._run(go)

    async def purge(self) -> int:
        """Take the text of deleted documents off the disk: every live document is deleted
        and added again from its stored fields, thread by thread, :data:`PURGE_STEP` at a
        time on the writer's thread (each step committed: the projector's writes wait at
        most one step, and searches read the same documents before and after it), so every
        segment older than the purge ends wholly deleted and is dropped at a commit; then
        their files are collected, as soon as no merge in flight reads them. A document
        added during the purge is rewritten or left in a new segment, never lost. While the
        index is filling, the fill's end runs it. Calls made while one runs share the next
        one (:class:`~memstream.projections.shared_runs.SharedRuns`: a purge that began
        after a call and succeeded covers its deletes). Returns the documents rewritten (0
        for a call another purge served)."""
        if self.filling:
            self._purge_after_fill = True
            return 0
        return await self._purges.run(self._purge) or 0  # concurrent erasures share them

    async def _purge(self) -> int:
        threads = await self._run(self._thread_counts)
        older = self._segments_in_meta()
        n = 0
        step: list[str] = []
        size = 0
        for key, count in threads:
            step.append(key)
            size += count
            if size >= PURGE_STEP:
                n += await self._run(functools.partial(self._rewrite_threads, step))
                step, size = [], 0
        if step:
            n += await self._run(functools.partial(self._rewrite_threads, step))
        await self._collect_files(older)
        return n

    def _segments_in_meta(self) -> set[str]:
        """The ids of the segments the last commit lists (as their files are named)."""
        meta = orjson.loads((self.path / "meta.json").read_bytes())
        return {str(seg["segment_id"]).replace("-", "") for seg in meta["segments"]}

    def _files_of(self, segments: set[str]) -> list[str]:
        return [f.name for f in self.path.iterdir() if f.name.split(".", 1)[0] in segments]

    async def _collect_files(self, older: set[str]) -> None:
        """Remove the files of the ``older`` segments (every one wholly deleted by now):
        those no commit uses go at the next collection; one a merge in flight still reads
        goes once that merge ends, so collect again until none is left (the writer's thread
        is taken a moment per pass, not for the merges: writes go on meanwhile)."""
        deadline = time.monotonic() + PURGE_COLLECT_WAIT_S
        while True:
            await self._run(lambda: self._w().garbage_collect_files())
            left = self._files_of(older)
            if not left:
                return
            if time.monotonic() > deadline:
                log.warning(
                    "lexical index %s: %d files of segments older than the purge are still "
                    "held after %.0f s (a merge in flight); the next purge or collection "
                    "removes them",
                    self.path,
                    len(left),
                    PURGE_COLLECT_WAIT_S,
                )
                return
            await asyncio.sleep(0.1)

    def _thread_counts(self) -> list[tuple[str, int]]:
        """Every thread key the term dictionary holds, with its documents (deleted ones
        included, until a merge), after committing what is pending."""
        if self._uncommitted:
            self._commit()
        terms = self._index.searcher().terms_with_prefix("thread_key", "")
        return [(str(term), int(count)) for term, count in terms]

    def _rewrite_threads(self, keys: Sequence[str]) -> int:
        if self._uncommitted:  # the searcher below holds every document added so far
            self._commit()
        searcher, Q = self._index.searcher(), self._tantivy.Query
        w = self._w()
        n = 0
        for key in keys:
            found = searcher.search(Q.term_query(self._schema, "thread_key", key), 1, count=True)
            if total := _count(found):
                self._rewrite_thread(searcher, w, key, total, None)
                n += total
        self._commit()
        return n

    # --- search ----------------------------------------------------------------------------

    async def best(self, query: IndexQuery) -> IndexResult:
        """BM25's best ``query.k`` visible messages for its words (see :class:`IndexQuery`),
        ordered by score, then newest, then higher offset, then thread id; with each word's
        df over the visible messages in scope."""
        return await self._read(lambda: self._best(query))

    def _best(self, query: IndexQuery) -> IndexResult:
        searcher = self._index.searcher()
        if not query.hidden or not self.by_readers:
            return self._best_in(query, searcher, by_key=True)
        found = self._best_in(query, searcher, by_key=False)
        hidden = set(query.hidden)
        stale = {
            h.thread_id
            for h in found.hits
            if ThreadRef(query.account_id, query.agent_id, h.thread_id).key in hidden
        }
        if not stale:
            return found
        # documents of a hidden thread tagged as readable (a retag not applied yet):
        # nothing of them is shown, and the statistics are counted without those threads
        again = self._best_in(query, searcher, by_key=True)
        return IndexResult(again.hits, again.dfs, again.exact, tuple(sorted(stale)))

    def _best_in(self, query: IndexQuery, searcher: Any, *, by_key: bool) -> IndexResult:
        """:meth:`_best` on ``searcher``: the caller's hidden threads kept out by the
        documents' readers, or (``by_key``) by their thread keys."""
        account_id, agent_id, thread_id = query.account_id, query.agent_id, query.thread_id
        words, hidden, k = query.words, query.hidden, query.k
        tv = self._tantivy
        Q, Occur, schema = tv.Query, tv.Occur, self._schema
        if thread_id is not None:
            scope = [
                (
                    Occur.Must,
                    Q.const_score_query(
                        Q.term_query(
                            schema, "thread_key", ThreadRef(account_id, agent_id, thread_id).key
                        ),
                        0.0,
                    ),
                )
            ]
        else:
            scope = [
                (
                    Occur.Must,
                    Q.const_score_query(Q.term_query(schema, "account_id", account_id), 0.0),
                ),
                (Occur.Must, Q.const_score_query(Q.term_query(schema, "agent_id", agent_id), 0.0)),
            ]
        # the excluded (deleted) threads are kept out by key whatever their readers; they
        # are not in ``hidden``, so :meth:`_best` never takes their hits for a lost retag
        by_keys = [*query.excluded, *(hidden if by_key else ())]
        if by_keys:
            scope.append((Occur.MustNot, Q.term_set_query(schema, "thread_key", by_keys)))
        if hidden and not by_key:  # what the caller may read: threads without users, own ones
            readable = [PUBLIC, f"u:{query.user_id}"]
            scope.append(
                (
                    Occur.Must,
                    Q.const_score_query(
                        Q.boolean_query(
                            [(Occur.Should, Q.term_query(schema, "readers", t)) for t in readable]
                        ),
                        0.0,
                    ),
                )
            )

        def count(q: Any) -> int:
            return _count(
                searcher.search(Q.boolean_query([(Occur.Must, q), *scope]), 1, count=True)
            )

        dfs = [count(Q.term_query(schema, "body", w)) for w in words]
        present = [w for w, df in zip(words, dfs, strict=True) if df]
        if not present:
            return IndexResult([], dfs, True)
        should = Q.boolean_query([(Occur.Should, Q.term_query(schema, "body", w)) for w in present])
        found = searcher.search(
            Q.boolean_query([(Occur.Must, should), *scope]), CANDIDATES, count=True
        )
        n_docs, avg_len = query.stats
        k1, b = query.bm25
        # every candidate scored from its terms' counts (C-speed), the same arithmetic as
        # fusion.bm25; only the best k are unpacked and get positions (the Python per
        # candidate holds the GIL: 300 of them cost ~5 ms, most of a search here)
        weights = [idf(n_docs, df) for df in dfs]
        avg = max(avg_len, 1.0)
        scored = []
        for _score, address in found.hits:
            doc = searcher.doc(address)
            terms = str(doc.get_first("body")).split(" ")
            tf = tuple(terms.count(w) for w in words)
            norm = k1 * (1 - b + b * len(terms) / avg)
            score = math.fsum(
                wt * f * (k1 + 1) / (f + norm) for f, wt in zip(tf, weights, strict=True) if f
            )
            scored.append(
                (
                    -score,
                    -int(str(doc.get_first("created_ms"))),
                    -int(str(doc.get_first("offset"))),
                    str(doc.get_first("thread_id")),
                    tf,
                    terms,
                    doc,
                )
            )
        scored.sort(key=lambda c: c[:4])
        hits = [
            IndexHit(
                thread_id,
                -neg_offset,
                -neg_created,
                -neg_score,
                tf,
                len(terms),
                tuple(tuple(i for i, t in enumerate(terms) if t == w) for w in words),
                _unpack(doc),
            )
            for neg_score, neg_created, neg_offset, thread_id, tf, terms, doc in scored[:k]
        ]
        return IndexResult(hits, dfs, _count(found) <= CANDIDATES)

    async def documents(
        self, account_id: str, agent_id: str, keys: Sequence[str], hidden: Sequence[str]
    ) -> list[IndexDoc]:
        """The messages of the agent at ``keys`` (:attr:`IndexRow.key`) that hold a term and
        are in none of the ``hidden`` thread keys, by key: the dense side's candidates, with
        the terms their BM25 is computed from (~1-2 ms for 50, where ClickHouse took 8)."""
        return await self._read(lambda: self._documents(account_id, agent_id, keys, hidden))

    def _documents(
        self, account_id: str, agent_id: str, keys: Sequence[str], hidden: Sequence[str]
    ) -> list[IndexDoc]:
        if not keys:
            return []
        tv, schema = self._tantivy, self._schema
        Q, Occur = tv.Query, tv.Occur
        clauses = [
            (Occur.Must, Q.term_set_query(schema, "key", list(keys))),
            (Occur.Must, Q.term_query(schema, "account_id", account_id)),
            (Occur.Must, Q.term_query(schema, "agent_id", agent_id)),
        ]
        searcher = self._index.searcher()
        found = searcher.search(Q.boolean_query(clauses), len(keys))
        # the hidden threads dropped here, not by a clause: a term set of 1,000 thread keys
        # costs ~1.7 ms at 1M (it reads every posting of those threads), a set lookup none
        hidden_keys = set(hidden)
        out = []
        for _score, address in found.hits:
            doc = searcher.doc(address)
            thread_id = str(doc.get_first("thread_id"))
            if ThreadRef(account_id, agent_id, thread_id).key in hidden_keys:
                continue
            out.append(
                IndexDoc(
                    thread_id,
                    int(str(doc.get_first("offset"))),
                    int(str(doc.get_first("created_ms"))),
                    str(doc.get_first("body")).split(" "),
                    _unpack(doc),
                )
            )
        return out

    async def count(self) -> int:
        return await self._read(lambda: int(self._index.searcher().num_docs))

    # --- lifecycle -------------------------------------------------------------------------

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        def go() -> None:
            if self._writer is not None:
                self._writer.commit()
                self._writer.wait_merging_threads()
                self._writer = None

        await self._run(go)
        self._pool.shutdown(wait=True)
        self._reads.shutdown(wait=True)


def _count(result: Any) -> int:
    """A search's match count (``count=True``; the stubs omit the attribute)."""
    return int(result.count)


_OPEN: dict[Path, LexicalIndex] = {}


def open_index(path: Path) -> LexicalIndex:
    """The process's one :class:`LexicalIndex` at ``path`` (Tantivy allows one writer per
    directory; a replay opens its target's index many times)."""
    path = path.resolve()
    index = _OPEN.get(path)
    if index is None or index._closed:
        index = _OPEN[path] = LexicalIndex(path)
    return index


async def close_indexes(root: Path) -> None:
    """Close every index this process opened under ``root``."""
    root = root.resolve()
    for path in [p for p in _OPEN if p.parent == root]:
        await _OPEN.pop(path).close()


async def drop_index(path: Path) -> None:
    """Close and delete the index at ``path`` (a dropped generation's)."""
    path = path.resolve()
    index = _OPEN.pop(path, None)
    if index is not None:
        await index.close()
    await asyncio.to_thread(shutil.rmtree, path, True)


def available() -> bool:
    """Whether Tantivy is installed (the ``embedded`` extra)."""
    try:
        import tantivy  # noqa: F401
    except ImportError:
        return False
    return True
