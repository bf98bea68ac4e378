"""An index kept by a child process of its own, called from this one.

qdrant-edge's Python binding holds the GIL for the whole of every call, on whatever thread
makes it: in the serving process a transcript search's walk over a 1M-message agent stopped
the event loop for ~11 ms, an exact scan of a 100k-message agent for its whole length, and
every other request (an append, a context read) waited that long (docs/transcript-search.md,
"what a search stopped"). So ``memstream up`` keeps its qdrant-edge shards in children:
the transcript's vector index (:mod:`.messages.vector_process`) and the memory index's
collections (:mod:`.memory_index.edge_process`), each a thin facade over :class:`Served`.

How: the child is ``python -m memstream.projections.served <fd>`` (a fresh interpreter that
imports only what the index needs: not the parent's main script, which
``multiprocessing``'s spawn would run again in the child, so a user's unguarded script or
the CLI would start twice); it receives the factory over a socket pair, builds the index
and answers calls from it on an event loop of its own (coroutine methods as tasks; blocking
ones on worker threads, as the in-process index runs them); the parent sends each call from
a worker thread (a batch of vectors is pickled there) and a reader thread settles its
future.

Guarantees:

- **The same answers.** The child runs the same index class; a call returns what it
  returned in process, once the child has done it (a write is in the shard's WAL on return).
- **A child that dies** (killed, out of memory) fails the calls in flight with a
  :class:`~memstream.errors.RetryableInfraError` naming it; the next call starts a new child
  on the same directory, which opens what was acknowledged.
- **No orphan.** The child exits when its socket closes (the parent closed the index,
  exited or was killed), closing its index first; :meth:`Served.close` waits for it (then
  kills it after a bound).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import itertools
import logging
import pickle
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Final

from memstream.errors import RetryableInfraError

log = logging.getLogger(__name__)

CLOSE_WAIT_S: Final = 30.0
"""How long :meth:`Served.close` waits for the child to close its index."""


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """qdrant-edge's ``ShardInfo`` across the pipe (the binding's own object does not
    pickle): what benches and tests read of it."""

    segments_count: int
    points_count: int
    indexed_vectors_count: int

    @classmethod
    def of(cls, info: Any) -> ShardInfo | None:
        if info is None:
            return None
        return cls(
            int(info.segments_count), int(info.points_count), int(info.indexed_vectors_count)
        )


class Served:
    """The parent's end: ``factory(*args)`` built and kept by a child process, whose
    methods named in ``calls`` are called through :meth:`call` (module docstring). The
    child starts on the first call and again after it died; :meth:`close` stops it. Calls
    may come from any event loop and thread."""

    def __init__(
        self,
        factory: Callable[..., Any],
        args: tuple[Any, ...],
        *,
        label: str,
        calls: frozenset[str],
    ) -> None:
        self.label = label
        self._factory = factory
        self._args = args
        self._calls_allowed = calls
        self._lock = threading.Lock()
        self._conn: Connection | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        # call id -> (the pipe it went down, its future)
        self._calls: dict[int, tuple[Connection, Future[Any]]] = {}
        self._ids = itertools.count()
        self._send_lock = threading.Lock()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pid(self) -> int | None:
        """The child's process id (None when none runs)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def _pipe(self) -> Connection:
        """The pipe to a running child, started if there is none."""
        with self._lock:
            if self._closed:
                raise RetryableInfraError(f"{self.label} is closed")
            proc, conn = self._proc, self._conn
            if conn is not None and proc is not None and proc.poll() is None:
                return conn
            ours, theirs = socket.socketpair()
            with theirs:
                proc = subprocess.Popen(  # noqa: S603 (this interpreter, our module)
                    [sys.executable, "-m", __name__, str(theirs.fileno())],
                    pass_fds=(theirs.fileno(),),
                    stdin=subprocess.DEVNULL,
                )
            parent = Connection(ours.detach())
            try:
                parent.send((self._factory, self._args, self._calls_allowed))
            except (OSError, EOFError) as e:
                proc.kill()
                parent.close()
                raise RetryableInfraError(f"the process of {self.label} did not start") from e
            self._proc, self._conn = proc, parent
            threading.Thread(
                target=self._read, args=(parent,), name="served-reader", daemon=True
            ).start()
            return parent

    def _read(self, conn: Connection) -> None:
        """Settle each answer's future; when the pipe ends, fail what still waits on it."""
        while True:
            try:
                call_id, ok, value = conn.recv()
            except (EOFError, OSError):
                break
            entry = self._calls.pop(call_id, None)
            if entry is None or entry[1].done():
                continue
            if ok:
                entry[1].set_result(value)
            else:
                entry[1].set_exception(value)
        with self._lock:
            if self._conn is conn:
                self._conn = None
        lost = RetryableInfraError(f"the process of {self.label} exited")
        for call_id, (sent_on, future) in list(self._calls.items()):
            if sent_on is conn:
                self._calls.pop(call_id, None)
                if not future.done():
                    future.set_exception(lost)
        # ``close`` may have closed it from the loop's thread already: EBADF, nothing to do
        with contextlib.suppress(OSError):
            conn.close()

    def send(self, method: str, *args: Any, **kwargs: Any) -> Future[Any]:
        """Send one call; its future. Blocks for the pickling and the pipe's write."""
        future: Future[Any] = Future()
        call_id = next(self._ids)
        conn = self._pipe()
        self._calls[call_id] = (conn, future)
        try:
            with self._send_lock:
                conn.send((call_id, method, args, kwargs))
        except (OSError, EOFError, ValueError, TypeError) as e:
            # the child died mid-write (a broken pipe), or the reader closed the pipe for it
            # meanwhile (the closed connection's handle is None: a TypeError)
            self._calls.pop(call_id, None)
            raise RetryableInfraError(
                f"the process of {self.label} exited while a call was sent to it"
            ) from e
        return future

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)`` in the child; its result, or its exception raised
        here."""
        future = await asyncio.to_thread(functools.partial(self.send, method, *args, **kwargs))
        return await asyncio.wrap_future(future)

    def call_blocking(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """:meth:`call` from a thread that may block (benches and tests)."""
        return self.send(method, *args, **kwargs).result()

    async def close(self) -> None:
        """Close the index in the child, then let the child go."""
        with self._lock:
            if self._closed:
                return
            conn, proc = self._conn, self._proc
        if conn is not None and proc is not None and proc.poll() is None:
            try:
                await asyncio.wait_for(self.call("close"), CLOSE_WAIT_S)
            except (RetryableInfraError, TimeoutError) as e:
                log.warning("%s: the child did not close cleanly: %s", self.label, e)
        with self._lock:
            self._closed = True
            conn, proc = self._conn, self._proc
            self._conn = self._proc = None
        if conn is not None:
            conn.close()
        if proc is not None:
            try:
                await asyncio.to_thread(proc.wait, CLOSE_WAIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                await asyncio.to_thread(proc.wait)


# --- the child -----------------------------------------------------------------------------
def _serve(fd: int) -> None:
    """The child's main: build the index the parent sends on the socket at ``fd``, then
    answer calls on it until it closes or ``close`` comes."""
    conn = Connection(fd)
    try:
        factory, args, calls = conn.recv()
    except (EOFError, OSError):
        return  # the parent went before it said what to serve
    asyncio.run(_answer_calls(conn, factory(*args), calls))


async def _answer_calls(conn: Connection, index: Any, allowed: frozenset[str]) -> None:
    loop = asyncio.get_running_loop()
    calls: asyncio.Queue[tuple[int, str, tuple[Any, ...], dict[str, Any]] | None] = asyncio.Queue()

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
            if call[1] == "close":
                if running:
                    await asyncio.wait(running)
                await _answer(conn, index, allowed, *call)
                return
            task = asyncio.create_task(_answer(conn, index, allowed, *call))
            running.add(task)
            task.add_done_callback(running.discard)
    finally:
        if running:
            await asyncio.wait(running)
        await index.close()


async def _answer(
    conn: Connection,
    index: Any,
    allowed: frozenset[str],
    call_id: int,
    method: str,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    try:
        if method != "close" and method not in allowed:
            raise ValueError(f"unknown call {method!r}")
        fn = getattr(index, method)
        if inspect.iscoroutinefunction(fn):
            value = await fn(*args, **kwargs)
        else:  # a blocking method: on a worker thread, as the in-process index runs them
            value = await asyncio.to_thread(fn, *args, **kwargs)
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
        return RetryableInfraError(f"{type(e).__name__}: {e}")
    return e


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
