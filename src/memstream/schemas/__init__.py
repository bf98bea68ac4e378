"""The vocabulary of memstream: records, events, topics, codec and the spec's numbers.

Pure: nothing here does I/O or imports any other memstream layer (only the leaf error tree).
"""

from memstream.schemas.events import (
    DecodeError,
    Envelope,
    EventType,
    decode,
    encode,
)
from memstream.schemas.records import (
    Caller,
    Category,
    MemoryEntry,
    Message,
    Role,
    Summary,
    ThreadConfig,
    ToolCall,
    Visibility,
)
from memstream.schemas.topics import Topics

__all__ = [
    "Caller",
    "Category",
    "DecodeError",
    "Envelope",
    "EventType",
    "MemoryEntry",
    "Message",
    "Role",
    "Summary",
    "ThreadConfig",
    "ToolCall",
    "Topics",
    "Visibility",
    "decode",
    "encode",
]
