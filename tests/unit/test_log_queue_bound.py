"""The off-loop log queue under a stalled writer: the caller never waits, the queue stays
bounded, and what was dropped is said in the log once the writer moves again."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from memstream.infra import log_queue
from memstream.infra.log_queue import OffLoopHandler


class Stalled(logging.Handler):
    """A handler whose writes block until ``go`` is set (a stderr pipe nobody reads)."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.go.wait(30)
        self.lines.append(record.getMessage())


def test_a_stalled_writer_drops_and_counts_beyond_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(log_queue, "MAX_QUEUED", 10)
    target = Stalled()
    handler = OffLoopHandler([target])
    handler.start()
    logger = logging.getLogger(f"test.log_queue.{id(target)}")
    logger.propagate = False
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        started = time.monotonic()
        for i in range(200):
            logger.info("line %d", i)
        assert time.monotonic() - started < 1.0  # the caller never waited for the writer
        assert handler.records.qsize() <= 10  # bounded while the writer is stuck
        target.go.set()
        handler.flush()
        written = [line for line in target.lines if line.startswith("line ")]
        dropped = [line for line in target.lines if "log lines dropped" in line]
        assert len(dropped) == 1
        count = int(dropped[0].split()[0])
        assert len(written) + count == 200 and count >= 189  # nothing lost silently
        assert written == sorted(written, key=lambda w: int(w.split()[1]))
    finally:
        logger.removeHandler(handler)
        target.go.set()
        handler.stop()
