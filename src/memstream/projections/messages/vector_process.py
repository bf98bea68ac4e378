"""The transcript's vector index in a process of its own (``memstream up``'s default).

qdrant-edge's Python binding holds the GIL for the whole of a query, on whatever thread
calls it: at 1M messages a search's walk stopped the serving process's event loop for
~11 ms, an exact scan of a 100k-message agent for its whole length, and every other request
of the process (an append, a context read) waited that long (docs/transcript-search.md,
"what a search stopped"). :class:`VectorIndexProcess` has :class:`~.vector_index.VectorIndex`'s
interface and runs one in a child process, so the shard's work takes the child's GIL, not
the server's.

How: a spawned child (:func:`_serve`) owns the shard and answers calls from one pipe on an
event loop of its own (each call a task, as the in-process index runs them on worker
threads); the parent sends each call from a worker thread and a reader thread settles its
future. The on-disk filling marker is read and written by the parent itself (it is a file).

Guarantees:

- **The same answers.** The child runs the same :class:`~.vector_index.VectorIndex`; a
  call returns what it returned in process, and once the child has done it (an upsert is in
  the shard's WAL on return, as before).
- **A child that dies** (killed, out of memory) fails the calls in flight with a
  :class:`~memstream.errors.RetryableInfraError` naming the shard; the next call starts a
  new child on the same directory, which opens what was acknowledged. Nothing is half
  applied by the parent: a write is the child's one shard update.
- **No orphan.** The child exits when its pipe closes (the parent closed the index, exited
  or was killed); :meth:`close` waits for it (then kills it after a bound).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing
import pickle
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Final

from memstream.errors import RetryableInfraError
from memstream.projections.memory_index.tuning import IndexTuning
from memstream.projections.messages.vector_index import (
    FILLING,
    TUNING,
    UPSERT_CHUNK,
    DenseQuery,
    VectorIndex,
    VectorRow,
)

log = logging.getLogger(__name__)

CLOSE_WAIT_S: Final = 30.0
"""How long :meth:`VectorIndexProcess.close` waits for the child to close its shard."""
_CALLS: Final = frozenset(
    {"upsert", "delete_threads", "count", "nearest", "maintain", "build", "info", "close"}
)
"""The :class:`~.vector_index.VectorIndex` methods the child answers."""


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """:meth:`VectorIndex.info` across the pipe (qdrant-edge's own object does not pickle)."""

    segments_count: int
    points_count: int
    indexed_vectors_count: int


class VectorIndexProcess:
    """A :class:`~.vector_index.VectorIndex` served by a child process (module docstring).

    The child starts on the first call and again after it died; :meth:`close` stops it.
    Calls may come from any event loop and thread."""

    def __init__(self, path: Path, tuning: IndexTuning = TUNING) -> None:
        self.path = path
        self.tuning = tuning
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._proc: BaseProcess | None = None
        # call id -> (the pipe it went down, its future)
        self._calls: dict[int, tuple[Connection, Future[Any]]] = {}
        self._ids = itertools.count()
        self._send_lock = threading.Lock()
        self._closed = False

    # --- state (the filling marker is a file: read and written here) ------------------------
    @property
    def filling(self) -> bool:
        return (self.path / FILLING).exists()

    @property
    def ready(self) -> bool:
        """Whether searches may read this shard (it holds every vector of the record)."""
        return not self.filling and not self._closed

    @property
    def closed(self) -> bool:
        return self._closed

    def mark_filling(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / FILLING).touch()

    # --- the child ---------------------------------------------------------------------------
    def _pipe(self) -> Connection:
        """The pipe to a running child, started if there is none."""
        with self._lock:
            if self._closed:
                raise RetryableInfraError(f"vector index {self.path} is closed")
            proc, conn = self._proc, self._conn
            if conn is not None and proc is not None and proc.is_alive():
                return conn
            ctx = multiprocessing.get_context("spawn")
            parent, child = ctx.Pipe()
            proc = ctx.Process(
                target=_serve,
                args=(child, str(self.path), self.tuning),
                name=f"memstream vector index {self.path.name}",
                daemon=True,
            )
            proc.start()
            child.close()
            self._proc, self._conn = proc, parent
            threading.Thread(
                target=self._read, args=(parent,), name="vector-index-reader", daemon=True
            ).start()
            return parent

    def _read(self, conn: Connection) -> None:
        """Settle each answer's future; when the pipe ends, fail what is still waiting."""
        while True:
            try:
                call_id, ok, value = conn.recv()
            except (EOFError, OSError):
                break
            entry = self._calls.pop(call_id, None)
            if entry is None:
                continue
            future = entry[1]
            if future.done():
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)
        with self._lock:
            if self._conn is conn:
                self._conn = None
        lost = RetryableInfraError(f"the vector index process of {self.path} exited")
        for call_id, (sent_on, future) in list(self._calls.items()):
            if sent_on is conn:
                self._calls.pop(call_id, None)
                if not future.done():
                    future.set_exception(lost)
        conn.close()

    def _send(self, method: str, args: tuple[Any, ...]) -> Future[Any]:
        future: Future[Any] = Future()
        call_id = next(self._ids)
        conn = self._pipe()
        self._calls[call_id] = (conn, future)
        try:
            with self._send_lock:
                conn.send((call_id, method, args))
        except (OSError, EOFError, ValueError) as e:
            self._calls.pop(call_id, None)
            raise RetryableInfraError(f"the vector index process of {self.path}: {e}") from e
        return future

    async def _call(self, method: str, *args: Any) -> Any:
        # sent from a worker thread: a fill's chunk pickles ~1,000 vectors
        future = await asyncio.to_thread(self._send, method, args)
        return await asyncio.wrap_future(future)

    # --- VectorIndex's interface -------------------------------------------------------------
    async def upsert(self, rows: Sequence[VectorRow]) -> None:
        """Write ``rows`` (durable on return: the shard's WAL, in the child)."""
        if rows:
            await self._call("upsert", list(rows))

    async def delete_threads(self, threads: Sequence[tuple[str, str, str]]) -> None:
        """Delete every point of the ``(account, agent, thread)`` threads (erasure)."""
        if threads:
            await self._call("delete_threads", list(threads))

    async def fill(self, batches: Callable[[], AsyncIterator[list[VectorRow]]]) -> int:
        """:meth:`VectorIndex.fill`: every row ``batches`` yields, under the filling marker."""
        self.mark_filling()
        n = 0
        async for rows in batches():
            for i in range(0, len(rows), UPSERT_CHUNK):
                await self.upsert(rows[i : i + UPSERT_CHUNK])
            n += len(rows)
        (self.path / FILLING).unlink(missing_ok=True)
        return n

    async def count(self, account_id: str | None = None, agent_id: str | None = None) -> int:
        return int(await self._call("count", account_id, agent_id))

    async def nearest(self, q: DenseQuery) -> dict[tuple[str, int], float]:
        result: dict[tuple[str, int], float] = await self._call("nearest", q)
        return result

    async def maintain(self, *, force: bool = False) -> bool:
        """:meth:`VectorIndex.maintain`, in the child (its GIL, not this process's)."""
        return bool(await self._call("maintain", force))

    async def build(self, *, force: bool = False) -> bool:
        return bool(await self._call("build", force))

    def info(self) -> ShardInfo | None:
        """Segments, points and indexed vectors (None before the first write); blocks."""
        result: ShardInfo | None = self._send("info", ()).result()
        return result

    async def close(self) -> None:
        """Close the shard in the child, then let the child go."""
        with self._lock:
            if self._closed:
                return
            conn, proc = self._conn, self._proc
        if conn is not None and proc is not None and proc.is_alive():
            try:
                await asyncio.wait_for(self._call("close"), CLOSE_WAIT_S)
            except (RetryableInfraError, TimeoutError) as e:
                log.warning("vector index %s: the child did not close cleanly: %s", self.path, e)
        with self._lock:
            self._closed = True
            conn, proc = self._conn, self._proc
            self._conn = self._proc = None
        if conn is not None:
            conn.close()
        if proc is not None:
            await asyncio.to_thread(proc.join, CLOSE_WAIT_S)
            if proc.is_alive():
                proc.kill()
                await asyncio.to_thread(proc.join, 5)

    @property
    def pid(self) -> int | None:
        """The child's process id (None when none runs): what a test kills."""
        proc = self._proc
        return proc.pid if proc is not None and proc.is_alive() else None


# --- the child -----------------------------------------------------------------------------
def _serve(conn: Connection, path: str, tuning: IndexTuning) -> None:
    """The child's main: answer calls on ``conn`` until it closes or ``close`` comes."""
    asyncio.run(_answer_calls(conn, VectorIndex(Path(path), tuning)))


async def _answer_calls(conn: Connection, index: VectorIndex) -> None:
    loop = asyncio.get_running_loop()
    calls: asyncio.Queue[tuple[int, str, tuple[Any, ...]] | None] = asyncio.Queue()

    def readable() -> None:
        try:
            calls.put_nowait(conn.recv())
        except (EOFError, OSError):
            loop.remove_reader(conn.fileno())
            calls.put_nowait(None)

    loop.add_reader(conn.fileno(), readable)
    running: set[asyncio.Task[None]] = set()
    try:
        while (call := await calls.get()) is not None:
            call_id, method, args = call
            if method == "close":
                if running:
                    await asyncio.wait(running)
                await _answer(conn, index, call_id, method, args)
                return
            task = asyncio.create_task(_answer(conn, index, call_id, method, args))
            running.add(task)
            task.add_done_callback(running.discard)
    finally:
        if running:
            await asyncio.wait(running)
        await index.close()


async def _answer(
    conn: Connection, index: VectorIndex, call_id: int, method: str, args: tuple[Any, ...]
) -> None:
    try:
        if method not in _CALLS:
            raise ValueError(f"unknown vector index call {method!r}")
        if method == "info":
            info = index.info()
            value: Any = (
                None
                if info is None
                else ShardInfo(
                    int(info.segments_count),
                    int(info.points_count),
                    int(info.indexed_vectors_count),
                )
            )
        elif method in ("maintain", "build"):
            value = await getattr(index, method)(force=args[0])
        else:
            value = await getattr(index, method)(*args)
        reply: tuple[int, bool, Any] = (call_id, True, value)
    except Exception as e:  # sent back to the caller, who raises it
        reply = (call_id, False, _portable(e))
    with contextlib.suppress(OSError, EOFError):  # the parent is gone: nobody waits
        conn.send(reply)


def _portable(e: Exception) -> Exception:
    """``e`` as it can cross the pipe (qdrant-edge's errors do not pickle)."""
    try:
        pickle.loads(pickle.dumps(e))  # noqa: S301 (our own bytes, this process's)
    except Exception:
        return RetryableInfraError(f"vector index: {type(e).__name__}: {e}")
    return e
