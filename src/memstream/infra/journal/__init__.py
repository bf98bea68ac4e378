"""The journal: SlateDB, the only authority for messages (see docs/journal.md).

- :class:`Journal` — the single fenced writer, with group commit (``writer.py``).
- :class:`JournalReader` — a read-only follower for other processes (``reader.py``).
- :func:`open_journal` / :func:`open_journal_reader` — build them from ``Settings``.
- ``keys`` — the key layout; ``codec`` — stored values (:class:`ToolCallRecord`).
"""

from memstream.infra.journal.codec import ToolCallRecord
from memstream.infra.journal.reader import JournalReader
from memstream.infra.journal.store import (
    journal_location,
    local_store,
    open_journal,
    open_journal_reader,
)
from memstream.infra.journal.writer import Journal, JournalStats

__all__ = [
    "Journal",
    "JournalReader",
    "JournalStats",
    "ToolCallRecord",
    "journal_location",
    "local_store",
    "open_journal",
    "open_journal_reader",
]
