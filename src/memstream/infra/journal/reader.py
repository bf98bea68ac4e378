"""``JournalReader``: read-only access to the journal from any process (API, workers).

It follows the writer through SlateDB's ``DbReader`` in ``FOLLOW_LATEST`` mode, polling the
manifest every ``poll_interval_ms`` (default 20 ms), so a durable append is visible to it
within about one poll interval. It never writes and never fences the writer. It offers the
same read methods as :class:`~memstream.infra.journal.writer.Journal` (``last``,
``read_range``, ``next_offset``, ``tool_call``, ``read_seq``, ``last_seq``,
``relay_watermark``), plus :meth:`wait_for` for read-your-writes across processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from slatedb.uniffi import DbReader, DbReaderBuilder, ObjectStore, ReaderMode, ReaderOptions

from memstream.infra.journal import fastpath
from memstream.infra.journal.failures import SLATE_FAILURES, translate
from memstream.infra.journal.reads import JournalReads
from memstream.schemas.records import ThreadRef


class JournalReader(JournalReads):
    """A follower of the journal. Build it with :meth:`open`."""

    def __init__(self, db: DbReader, poll_interval_ms: int) -> None:
        self._db = db
        self._reader = db
        self._poll_s = poll_interval_ms / 1000

    @classmethod
    async def open(
        cls,
        object_store: ObjectStore,
        path: str,
        *,
        poll_interval_ms: int = 20,
        fast_binding: bool = True,
    ) -> JournalReader:
        """Open a reader on the journal at ``path`` (the writer must have created it)."""
        if fast_binding:
            fastpath.install()
        try:
            builder = DbReaderBuilder(path, object_store)
            builder.with_reader_mode(ReaderMode.FOLLOW_LATEST())
            builder.with_options(
                ReaderOptions(
                    manifest_poll_interval_ms=poll_interval_ms,
                    checkpoint_lifetime_ms=10 * 60 * 1000,
                    max_memtable_bytes=64 * 1024 * 1024,
                    skip_wal_replay=False,
                )
            )
            db = await builder.build()
        except SLATE_FAILURES as e:
            raise translate(e, f"opening a journal reader at {path!r}") from e
        return cls(db, poll_interval_ms)

    async def wait_for(self, ref: ThreadRef, offset: int, timeout: float) -> bool:
        """Wait until the message at ``offset`` of ``ref`` is visible here; False on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            if await self.next_offset(ref) > offset:
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            await asyncio.sleep(min(self._poll_s, remaining))

    async def close(self) -> None:
        # already closed or store gone: nothing left to release
        with contextlib.suppress(*SLATE_FAILURES):
            await self._reader.shutdown()
