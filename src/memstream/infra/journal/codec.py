"""Values stored in the journal: messages, tool-call records, sequence blocks. Pure: no I/O.

Messages are stored as orjson of :meth:`Message.to_dict` (the same shape the ``journal``
topic carries), so a stored message and a published one can never drift apart. Tool-call
records are a small JSON object; readers ignore fields they do not know.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

import orjson

from memstream.schemas.records import JSONObject, JSONValue, Message


@dataclass(frozen=True, slots=True)
class ToolCallRecord:
    """One tool call of an agent, by id: what was asked (``name``, ``arguments``) and what came
    back (``result``, the content of the ``tool`` message answering it, or None until then).

    ``name`` is None only when a ``tool`` result arrived for an id no assistant message asked
    for. ``thread_id``/``offset`` locate the assistant message that made the call (or the tool
    message, when there was none).
    """

    name: str | None
    arguments: JSONValue = None
    result: str | None = None
    thread_id: str | None = None
    offset: int | None = None

    def to_dict(self) -> JSONObject:
        return {
            "name": self.name,
            "arguments": self.arguments,
            "result": self.result,
            "thread_id": self.thread_id,
            "offset": self.offset,
        }

    def document(self) -> JSONObject:
        """The JSON document ``journal_tool_call_view`` pages over: name, arguments, result."""
        return {"name": self.name, "arguments": self.arguments, "result": self.result}

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> ToolCallRecord:
        name = d.get("name")
        result = d.get("result")
        thread_id = d.get("thread_id")
        offset = d.get("offset")
        return cls(
            name=name if isinstance(name, str) else None,
            arguments=cast(JSONValue, d.get("arguments")),
            result=result if isinstance(result, str) else None,
            thread_id=thread_id if isinstance(thread_id, str) else None,
            offset=offset if isinstance(offset, int) else None,
        )


def encode_message(msg: Message) -> bytes:
    return orjson.dumps(msg.to_dict())


def decode_message(raw: bytes) -> Message:
    obj = orjson.loads(raw)
    if not isinstance(obj, dict):
        raise ValueError("stored message is not a JSON object")
    return Message.from_dict(obj)


def encode_tool_call(rec: ToolCallRecord) -> bytes:
    return orjson.dumps(rec.to_dict())


def decode_tool_call(raw: bytes) -> ToolCallRecord:
    obj = orjson.loads(raw)
    if not isinstance(obj, dict):
        raise ValueError("stored tool call is not a JSON object")
    return ToolCallRecord.from_dict(obj)


# --- sequence blocks ---------------------------------------------------------------------------
_LEN = struct.Struct(">I")


def encode_seq_block(envelopes: Sequence[bytes]) -> bytes:
    """The encoded envelopes of consecutive seqs, as one value: ``(u32 length, bytes)*``.

    One group commit writes one block (keyed by its first seq) instead of one key per seq:
    half the puts per message, and the relay reads a whole batch with one key.
    """
    parts: list[bytes] = []
    for env in envelopes:
        parts.append(_LEN.pack(len(env)))
        parts.append(env)
    return b"".join(parts)


def decode_seq_block(raw: bytes) -> list[bytes]:
    out: list[bytes] = []
    pos = 0
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise ValueError("truncated sequence block")
        (n,) = _LEN.unpack_from(raw, pos)
        pos += 4
        if pos + n > len(raw):
            raise ValueError("truncated sequence block")
        out.append(raw[pos : pos + n])
        pos += n
    return out


def seq_block_len(raw: bytes) -> int:
    """How many envelopes (seqs) a block holds, without copying them."""
    count = pos = 0
    while pos < len(raw):
        if pos + 4 > len(raw):
            raise ValueError("truncated sequence block")
        (n,) = _LEN.unpack_from(raw, pos)
        pos += 4 + n
        count += 1
    if pos != len(raw):
        raise ValueError("truncated sequence block")
    return count
