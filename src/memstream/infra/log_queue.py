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
* **Lossless.** ``close()`` (``logging.shutdown`` calls it: at interpreter exit, and in
  ``memstream up``'s exit watchdog before ``os._exit``) stops the listener after it wrote
  every queued record; a record logged after that is written in the caller.
* **A stalled writer never stalls the caller**: the queue is unbounded (a stuck stderr
  pipe grows memory, it does not stop the API).
* ``handle`` takes no handler lock (the queue is thread-safe), so a record the listener
  thread logs itself, or one logged while ``close()`` waits for the thread, cannot deadlock.
"""

from __future__ import annotations

import logging
import logging.handlers
import queue
import threading

from memstream.infra.logs import request_id

__all__ = ["OffLoopHandler", "write_off_loop", "writing_handlers"]

#: argument types a record may carry to another thread unformatted: they cannot change
_IMMUTABLE = frozenset({str, int, float, bool, type(None), bytes})


class OffLoopHandler(logging.handlers.QueueHandler):
    """Enqueue records for :attr:`listener`, which writes them to the real handlers."""

    def __init__(self, targets: list[logging.Handler]) -> None:
        # records, and None: the listener's stop sentinel
        q: queue.SimpleQueue[logging.LogRecord | None] = queue.SimpleQueue()
        super().__init__(q)
        self.records = q
        self.listener = logging.handlers.QueueListener(q, *targets, respect_handler_level=True)
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
            if self._stopped.is_set():
                self.listener.handle(record)  # after close: write it here, lose nothing
            else:
                self.enqueue(record)
        except Exception:
            self.handleError(record)

    def close(self) -> None:
        """Write every queued record, stop the thread (idempotent)."""
        if not self._stopped.is_set():
            self._stopped.set()
            if self._started:
                self.listener.stop()
            while True:  # records queued after the stop sentinel, by a thread that raced it
                try:
                    record = self.records.get_nowait()
                except queue.Empty:
                    break
                if record is not None:
                    self.listener.handle(record)
        super().close()


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
