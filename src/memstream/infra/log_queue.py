"""Log records written off the event loop: one queue in front of the process's handlers.

:func:`write_off_loop` moves a logger's handlers (the root's, in the serving commands) behind
one :class:`OffLoopHandler`. Logging a line then costs the caller the ``LogRecord`` and a
``put`` on a queue; a ``QueueListener`` thread filters, formats and writes it (the access log
of ``memstream up`` writes one line per HTTP request, on the loop until then).

Guarantees:

* **The same lines.** A record reaches the handlers as it was logged, not pre-formatted (as
  ``QueueHandler.prepare`` does by default), so every formatter prints what it printed when
  it ran in the caller. Two things only the caller can see are taken with the record: the
  request id (a context variable of the request's task, ``infra.logs.request_id``) and the
  message, when an argument is of a type that could change before the thread formats it (a
  list, an object): it is then formatted in the caller, as before. Strings, numbers, None
  (the access line's arguments) stay lazy.
* **Lossless.** ``flush()`` and ``close()`` return once every record queued before them is
  written, and the thread goes on (``logging.config.dictConfig``, which uvicorn runs at
  start, closes every handler of the process; ``memstream up``'s exit watchdog flushes the
  root's handlers before ``os._exit``). At interpreter exit, :meth:`OffLoopHandler.stop`
  writes what is queued and ends the thread; a record logged after that is written by its
  caller.
* **A stalled writer never stalls the caller, nor grows without bound**: past
  :data:`MAX_QUEUED` records waiting (a stuck stderr pipe), new records are dropped and
  counted, and the thread writes one warning saying how many before its next line.
* ``handle`` takes no handler lock (the queue is thread-safe), so a record the listener
  thread logs itself, or one logged while ``close()`` waits for the thread, cannot deadlock.
  A flush waits at most ``FLUSH_WAIT_S`` (a stalled stderr does not hang the exit).
"""

from __future__ import annotations

import atexit
import logging
import logging.handlers
import queue
import threading
from collections.abc import Callable

from memstream.infra.logs import request_id

__all__ = ["OffLoopHandler", "write_off_loop", "writing_handlers"]

#: the longest a flush waits for the thread to write what is queued
FLUSH_WAIT_S = 10.0
#: records waiting for the thread beyond which new ones are dropped (and counted)
MAX_QUEUED = 100_000
#: argument types a record may carry to another thread unformatted: they cannot change
_IMMUTABLE = frozenset({str, int, float, bool, type(None), bytes})


class _Flush:
    """A marker put on the queue: set once the listener got to it (all before it written)."""

    def __init__(self) -> None:
        self.done = threading.Event()


class _Listener(logging.handlers.QueueListener):
    #: set by the handler: how many records it dropped since the last call (and reset)
    take_dropped: Callable[[], int] = staticmethod(lambda: 0)

    def handle(self, record: logging.LogRecord) -> None:
        dropped = self.take_dropped()
        if dropped:
            super().handle(
                logging.makeLogRecord(
                    {
                        "name": __name__,
                        "levelno": logging.WARNING,
                        "levelname": "WARNING",
                        "msg": "%d log lines dropped: the log writer was stalled",
                        "args": (dropped,),
                    }
                )
            )
        if isinstance(record, _Flush):
            record.done.set()
            return
        super().handle(record)

    def is_current(self) -> bool:
        """True on the listener's own thread."""
        return threading.current_thread() is self._thread


class OffLoopHandler(logging.handlers.QueueHandler):
    """Enqueue records for :attr:`listener`, which writes them to the real handlers."""

    def __init__(self, targets: list[logging.Handler]) -> None:
        # records, flush markers, and None: the listener's stop sentinel
        q: queue.SimpleQueue[logging.LogRecord | _Flush | None] = queue.SimpleQueue()
        super().__init__(q)
        self.records = q
        self.listener = _Listener(q, *targets, respect_handler_level=True)
        self.listener.take_dropped = self._take_dropped
        self.dropped = 0  # records dropped since the listener last reported them
        self._drops = threading.Lock()
        self._started = False
        self._stopped = threading.Event()

    def start(self) -> None:
        self.listener.start()
        self._started = True

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        """What the caller must take with the record; formatting is left to the thread."""
        if getattr(record, "request_id", None) is None:
            rid = request_id.get()
            if rid is not None:
                record.__dict__["request_id"] = rid
        args = record.args
        if args and not (isinstance(args, tuple) and all(type(a) in _IMMUTABLE for a in args)):
            record.msg, record.args = record.getMessage(), None
        return record

    def handle(self, record: logging.LogRecord) -> bool:
        """``Handler.handle`` without the lock: ``put`` on the queue is thread-safe."""
        if not self.filter(record):
            return False
        self.emit(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        try:
            record = self.prepare(record)
            if self._stopped.is_set() or not self._started:
                self.listener.handle(record)  # no thread (yet, any more): write it here
            elif self.records.qsize() >= MAX_QUEUED:
                with self._drops:
                    self.dropped += 1
            else:
                self.enqueue(record)
        except Exception:
            self.handleError(record)

    def _take_dropped(self) -> int:
        with self._drops:
            n, self.dropped = self.dropped, 0
        return n

    def flush(self) -> None:
        """Return once every record queued so far is written (at most ``FLUSH_WAIT_S``: a
        stalled stderr does not hold the caller forever)."""
        if not self._stopped.is_set():
            self._wait_written()

    def close(self) -> None:
        """Flush, and keep the thread: ``logging.config.dictConfig`` (uvicorn calls it when
        it starts) closes every handler of the process, and logging goes on after it. The
        thread ends with :meth:`stop`."""
        self.flush()
        super().close()

    def stop(self) -> None:
        """Write every queued record and end the thread; later records are written by their
        caller (idempotent). :func:`write_off_loop` runs it at interpreter exit."""
        if self._started and not self._stopped.is_set():
            self._stopped.set()  # from now on, records are written by their caller
            self._wait_written()
            self.listener.enqueue_sentinel()

    def _wait_written(self) -> None:
        if self._started and not self.listener.is_current():
            marker = _Flush()
            self.records.put_nowait(marker)
            marker.done.wait(FLUSH_WAIT_S)


def writing_handlers(logger: logging.Logger) -> list[logging.Handler]:
    """The handlers that write ``logger``'s lines: behind its :class:`OffLoopHandler` if it
    has one, else its own."""
    for h in logger.handlers:
        if isinstance(h, OffLoopHandler):
            return list(h.listener.handlers)
    return list(logger.handlers)


def write_off_loop(logger: logging.Logger) -> None:
    """Move ``logger``'s handlers behind one :class:`OffLoopHandler` and start its thread
    (nothing to do if it already has one, or has no handler)."""
    if not logger.handlers or any(isinstance(h, OffLoopHandler) for h in logger.handlers):
        return
    targets = list(logger.handlers)
    handler = OffLoopHandler(targets)
    for t in targets:
        logger.removeHandler(t)
    logger.addHandler(handler)
    handler.start()
    # before logging's own exit hook (atexit runs the last registered first): the queue is
    # written, then logging.shutdown flushes the real handlers
    atexit.register(handler.stop)
