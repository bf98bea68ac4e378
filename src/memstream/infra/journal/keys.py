"""The journal's key layout in SlateDB, and message ids. Pure: no I/O.

Every key starts with a one-byte keyspace tag, followed by an order-preserving tuple encoding
(strings: UTF-8 with ``0x00`` escaped as ``0x00 0xFF`` and terminated by ``0x00 0x01``; integers:
unsigned 64-bit big-endian)::

    m | account | agent | thread | offset:u64   -> one Message (orjson of Message.to_dict())
    s | first_seq:u64                            -> a block of encoded Envelopes, seqs
                                                    first_seq, first_seq+1, ... (one per
                                                    group commit; the relay's log)
    t | account | agent | tool_call_id | thread -> one ToolCallRecord (ids are only unique
                                                    within a thread; a prefix scan without
                                                    the thread finds every thread's record)
    e | account | agent | thread | seq:u64      -> empty: a ``thread.*`` event of the thread
                                                    is at ``seq`` in the sequence log (its
                                                    messages carry their own seq), so an
                                                    erasure finds the thread's blocks without
                                                    reading the whole log
    w | name                                     -> journal metadata (relay watermark, the
                                                    seq thread events are indexed from)

Guarantees (tested with hypothesis):

- Encoded offsets and seqs sort like the integers, so a prefix scan reads a thread in offset
  order and the sequence log in seq order; a descending scan gives the newest first.
- The encoding is prefix-free per component: a thread's prefix never prefixes a key of another
  thread (``a/b`` vs ``a/bc``, ids containing ``/`` or NUL are all distinct).
- ``decode_*`` inverts ``*_key`` exactly.
"""

from __future__ import annotations

import struct
from typing import Final

from memstream.errors import InvalidRequest
from memstream.schemas.records import ThreadRef

MESSAGES: Final = b"m"
SEQUENCE: Final = b"s"
TOOL_CALLS: Final = b"t"
THREAD_EVENTS: Final = b"e"
META: Final = b"w"

U64_MAX: Final = 2**64 - 1
_U64 = struct.Struct(">Q")
_ESC = b"\x00\xff"
_END = b"\x00\x01"


def u64(n: int, *, field: str = "offset") -> bytes:
    """``n`` as 8 big-endian bytes (sorts like the integer); out of range names ``field``."""
    if not 0 <= n <= U64_MAX:
        raise InvalidRequest(f"{field} must be in 0..2**64-1, got {n}", field=field)
    return _U64.pack(n)


def read_u64(b: bytes) -> int:
    value: int = _U64.unpack(b)[0]
    return value


def _str(s: str) -> bytes:
    return s.encode("utf-8").replace(b"\x00", _ESC) + _END


def _read_str(b: bytes, pos: int) -> tuple[str, int]:
    """Decode one string component starting at ``pos``; returns it and the next position."""
    out = bytearray()
    while True:
        i = b.find(b"\x00", pos)
        if i < 0:
            raise ValueError("unterminated string component")
        out += b[pos:i]
        nxt = b[i + 1] if i + 1 < len(b) else -1
        if nxt == 0xFF:
            out += b"\x00"
            pos = i + 2
        elif nxt == 0x01:
            return out.decode("utf-8"), i + 2
        else:
            raise ValueError("bad escape in string component")


# --- messages --------------------------------------------------------------------------------
def _thread(ref: ThreadRef) -> bytes:
    return _str(ref.account_id) + _str(ref.agent_id) + _str(ref.thread_id)


def thread_prefix(ref: ThreadRef) -> bytes:
    """The prefix of every message key of one thread."""
    return MESSAGES + _thread(ref)


def message_key(ref: ThreadRef, offset: int) -> bytes:
    return thread_prefix(ref) + u64(offset)


def decode_message_key(key: bytes) -> tuple[ThreadRef, int]:
    return _decode_thread_u64(key, MESSAGES, "message key", "offset")


def _decode_thread_u64(key: bytes, tag: bytes, what: str, number: str) -> tuple[ThreadRef, int]:
    """(thread, number) of a ``tag | account | agent | thread | number:u64`` key."""
    if not key.startswith(tag):
        raise ValueError(f"not a {what}")
    account, pos = _read_str(key, 1)
    agent, pos = _read_str(key, pos)
    thread, pos = _read_str(key, pos)
    if len(key) - pos != 8:
        raise ValueError(f"bad {number} suffix")
    return ThreadRef(account, agent, thread), read_u64(key[pos:])


# --- global sequence -------------------------------------------------------------------------
def seq_key(seq: int) -> bytes:
    return SEQUENCE + u64(seq, field="seq")


def decode_seq_key(key: bytes) -> int:
    if not key.startswith(SEQUENCE) or len(key) != 9:
        raise ValueError("not a seq key")
    return read_u64(key[1:])


# --- thread events -----------------------------------------------------------------------------
def thread_events_prefix(ref: ThreadRef) -> bytes:
    """The prefix of every event-index key of one thread."""
    return THREAD_EVENTS + _thread(ref)


def thread_event_key(ref: ThreadRef, seq: int) -> bytes:
    return thread_events_prefix(ref) + u64(seq, field="seq")


def decode_thread_event_key(key: bytes) -> tuple[ThreadRef, int]:
    return _decode_thread_u64(key, THREAD_EVENTS, "thread-event key", "seq")


# --- tool calls --------------------------------------------------------------------------------
def tool_call_prefix(account_id: str, agent_id: str, tool_call_id: str) -> bytes:
    """The prefix of every thread's record of one tool-call id."""
    return TOOL_CALLS + _str(account_id) + _str(agent_id) + _str(tool_call_id)


def agent_tool_calls_prefix(account_id: str, agent_id: str) -> bytes:
    """The prefix of every tool-call key of one agent (erasure scans it)."""
    return TOOL_CALLS + _str(account_id) + _str(agent_id)


def tool_call_key(account_id: str, agent_id: str, tool_call_id: str, thread_id: str) -> bytes:
    return tool_call_prefix(account_id, agent_id, tool_call_id) + _str(thread_id)


def decode_tool_call_key(key: bytes) -> tuple[str, str, str, str | None]:
    """(account, agent, tool_call_id, thread). The thread is None for a key written before
    records were keyed by thread (its record carries the thread instead)."""
    if not key.startswith(TOOL_CALLS):
        raise ValueError("not a tool-call key")
    account, pos = _read_str(key, 1)
    agent, pos = _read_str(key, pos)
    call, pos = _read_str(key, pos)
    if pos == len(key):
        return account, agent, call, None
    thread, pos = _read_str(key, pos)
    if pos != len(key):
        raise ValueError("trailing bytes after tool-call key")
    return account, agent, call, thread


# --- metadata --------------------------------------------------------------------------------
RELAY_WATERMARK: Final = META + _str("relay_watermark")
EVENTS_INDEXED_FROM: Final = META + _str("events_indexed_from")
"""The first seq whose ``thread.*`` events have ``e`` keys (a journal written before the
index existed has none for the events below it)."""


# --- message ids -----------------------------------------------------------------------------
_ENTROPY_BITS: Final = 80
ENTROPY_MAX: Final = 2**_ENTROPY_BITS - 1


def message_id(ms: int, entropy: int) -> str:
    """A time-ordered 32-hex-digit id (ULID layout): 48-bit epoch ms, then 80 bits of entropy.

    Ids sort by ``ms`` first; the writer keeps them strictly increasing within one process by
    bumping ``entropy`` when two ids share a millisecond.
    """
    if not 0 <= ms < 2**48:
        raise ValueError("ms outside the 48-bit range")
    if not 0 <= entropy <= ENTROPY_MAX:
        raise ValueError("entropy outside the 80-bit range")
    return f"{ms:012x}{entropy:020x}"
