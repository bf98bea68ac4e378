"""The event envelope, every event type, and the orjson codec.

Wire form (one JSON object per Kafka record)::

    {"v": 1, "type": "message.appended", "id": "<unique>", "ts": <epoch ms>,
     "account_id": "...", "agent_id": "...", "thread_id": "..." | null, "data": {...}}

Guarantees:

- ``encode`` then ``decode`` is the identity on :class:`Envelope` (tested with hypothesis).
- ``decode`` ignores unknown fields, upcasts older envelope versions (see ``_UPCASTERS``) and
  raises :class:`DecodeError` (an ``InvalidRequest`` naming the field) on anything it cannot
  read, so a consumer can send the raw bytes to the dead-letter topic.
- Event ids are deterministic where a natural key exists (``message.appended`` uses the
  message id), so a re-publish after a crash carries the same id and consumers can dedupe.

Speed: ``decode`` runs on every record a stream processor reads. A current-version envelope
with exactly-typed fields takes a straight-line fast path (one lookup per field, the slots
filled without the frozen ``__init__``); anything else goes through the checked reader
(``_decode_checked``: upcasting, errors naming the field), so results and errors are the same.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, cast, get_args

import orjson

from memstream.errors import InvalidRequest
from memstream.schemas.records import JSONObject, MemoryEntry, Message, Summary, _slot_setters

ENVELOPE_VERSION: Final = 1

EventType = Literal[
    "message.appended",
    "thread.created",
    "thread.configured",
    "thread.deleted",
    "memory.stored",
    "memory.replaced",
    "memory.forgotten",
    "memory.recalled",
    "memory.decayed",
    "memory.expired",
    "summary.requested",
    "summary.written",
    "dlq.dead_letter",
]
EVENT_TYPES: Final[frozenset[str]] = frozenset(get_args(EventType))


class DecodeError(InvalidRequest):
    """Bytes that are not a valid envelope. Consumers route them to the dead-letter topic."""


@dataclass(frozen=True, slots=True)
class Envelope:
    type: EventType
    id: str
    ts: int
    account_id: str
    agent_id: str
    thread_id: str | None = None
    data: JSONObject = field(default_factory=dict)
    v: int = ENVELOPE_VERSION

    def to_dict(self) -> JSONObject:
        return {
            "v": self.v,
            "type": self.type,
            "id": self.id,
            "ts": self.ts,
            "account_id": self.account_id,
            "agent_id": self.agent_id,
            "thread_id": self.thread_id,
            "data": self.data,
        }


def new_event_id() -> str:
    return uuid.uuid4().hex


def encode(env: Envelope) -> bytes:
    return orjson.dumps(env.to_dict())


def _upcast_v0_v1(d: dict[str, object]) -> dict[str, object]:
    # v0 (pre-release) had "payload" instead of "data"; kept as the worked example of upcasting.
    d = dict(d)
    if "data" not in d and "payload" in d:
        d["data"] = d.pop("payload")
    d["v"] = 1
    return d


_UPCASTERS: Final[dict[int, Callable[[dict[str, object]], dict[str, object]]]] = {
    0: _upcast_v0_v1,
}


_ENVELOPE_SET = _slot_setters(
    Envelope, ("v", "type", "id", "ts", "account_id", "agent_id", "thread_id", "data")
)
_SET_V, _SET_TYPE, _SET_ID, _SET_TS, _SET_ACCOUNT, _SET_AGENT, _SET_THREAD, _SET_DATA = (
    _ENVELOPE_SET
)
_new = object.__new__
_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError


def decode(raw: bytes | str) -> Envelope:
    """Read one envelope (see the module docstring for what is checked); ``DecodeError``
    names the field it could not read."""
    try:
        obj = _loads(raw)
    except _JSONDecodeError as e:
        raise DecodeError(f"not JSON: {e}", field="$") from None
    if type(obj) is dict:
        g = obj.get
        v, typ, eid, ts = g("v"), g("type"), g("id"), g("ts")
        account_id, agent_id, thread_id = g("account_id"), g("agent_id"), g("thread_id")
        data = g("data", _MISSING)
        if data is _MISSING:
            data = {}
        if (
            type(v) is int
            and v == ENVELOPE_VERSION
            and type(typ) is str
            and typ in EVENT_TYPES
            and type(eid) is str
            and type(ts) is int
            and type(account_id) is str
            and type(agent_id) is str
            and (thread_id is None or type(thread_id) is str)
            and type(data) is dict
        ):
            env: Envelope = _new(Envelope)
            _SET_V(env, v)
            _SET_TYPE(env, typ)
            _SET_ID(env, eid)
            _SET_TS(env, ts)
            _SET_ACCOUNT(env, account_id)
            _SET_AGENT(env, agent_id)
            _SET_THREAD(env, thread_id)
            _SET_DATA(env, data)
            return env
    return _decode_checked(obj)


_MISSING: Final = object()


def _decode_checked(obj: object) -> Envelope:
    """The reference reader of a parsed envelope: upcasting and every check, in order."""
    if not isinstance(obj, dict):
        raise DecodeError("an envelope must be a JSON object", field="$")
    d: dict[str, object] = obj
    v = d.get("v", 0)
    if not isinstance(v, int) or isinstance(v, bool):
        raise DecodeError("v must be an integer", field="v")
    while v < ENVELOPE_VERSION:
        up = _UPCASTERS.get(v)
        if up is None:
            raise DecodeError(f"no upcaster from envelope version {v}", field="v")
        d = up(d)
        v = cast(int, d["v"])
    if v > ENVELOPE_VERSION:
        raise DecodeError(
            f"envelope version {v} is newer than this reader ({ENVELOPE_VERSION})", field="v"
        )
    typ = d.get("type")
    if not isinstance(typ, str) or typ not in EVENT_TYPES:
        raise DecodeError(f"unknown event type {typ!r}", field="type")
    for name in ("id", "account_id", "agent_id"):
        if not isinstance(d.get(name), str):
            raise DecodeError(f"{name} must be a string", field=name)
    ts = d.get("ts")
    if not isinstance(ts, int) or isinstance(ts, bool):
        raise DecodeError("ts must be an integer (epoch ms)", field="ts")
    thread_id = d.get("thread_id")
    if thread_id is not None and not isinstance(thread_id, str):
        raise DecodeError("thread_id must be a string or null", field="thread_id")
    data = d.get("data", {})
    if not isinstance(data, dict):
        raise DecodeError("data must be an object", field="data")
    return Envelope(
        v=v,
        type=cast(EventType, typ),
        id=cast(str, d["id"]),
        ts=ts,
        account_id=cast(str, d["account_id"]),
        agent_id=cast(str, d["agent_id"]),
        thread_id=thread_id,
        data=cast(JSONObject, data),
    )


# --- constructors: one per event type, so producers never hand-build ``data`` ---------------
def message_appended(msg: Message, ts: int) -> Envelope:
    return Envelope(
        type="message.appended",
        id=f"msg:{msg.message_id}",
        ts=ts,
        account_id=msg.account_id,
        agent_id=msg.agent_id,
        thread_id=msg.thread_id,
        data=msg.to_dict(),
    )


def message_tenancy(account_id: str, agent_id: str, thread_id: str) -> bytes:
    """The JSON members a ``message.appended`` envelope takes from its thread
    (``"account_id":..,"agent_id":..,"thread_id":..``), for :func:`encode_message_appended`."""
    return orjson.dumps({"account_id": account_id, "agent_id": agent_id, "thread_id": thread_id})[
        1:-1
    ]


_MA_HEAD: Final = b'{"v":%d,"type":"message.appended","id":' % ENVELOPE_VERSION


def encode_message_appended(
    msg: Message, ts: int, data: bytes, tenancy: bytes | None = None
) -> bytes:
    """``encode(message_appended(msg, ts))``, byte for byte, given ``data`` =
    ``orjson.dumps(msg.to_dict())`` (and optionally ``tenancy`` = :func:`message_tenancy` of
    the message's thread): the journal serializes each message once for its own record and
    splices the same bytes into the envelope, without building an ``Envelope``."""
    if tenancy is None:
        tenancy = message_tenancy(msg.account_id, msg.agent_id, msg.thread_id)
    return b"".join(
        (
            _MA_HEAD,
            orjson.dumps("msg:" + msg.message_id),
            b',"ts":%d,' % ts,
            tenancy,
            b',"data":',
            data,
            b"}",
        )
    )


def thread_event(
    typ: Literal["thread.created", "thread.configured", "thread.deleted"],
    account_id: str,
    agent_id: str,
    thread_id: str,
    ts: int,
    data: JSONObject | None = None,
    event_id: str | None = None,
) -> Envelope:
    return Envelope(
        type=typ,
        id=event_id or new_event_id(),
        ts=ts,
        account_id=account_id,
        agent_id=agent_id,
        thread_id=thread_id,
        data=data or {},
    )


MemoryEventType = Literal[
    "memory.stored",
    "memory.replaced",
    "memory.forgotten",
    "memory.recalled",
    "memory.decayed",
    "memory.expired",
]


def memory_event(
    typ: MemoryEventType, entry: MemoryEntry, ts: int, event_id: str | None = None
) -> Envelope:
    """A change to one entry. The id is deterministic per (entry identity, version, type)."""
    eid = event_id or (
        f"mem:{entry.account_id}/{entry.agent_id}/{entry.owner}/{entry.key}@{entry.version}:{typ}"
    )
    return Envelope(
        type=typ,
        id=eid,
        ts=ts,
        account_id=entry.account_id,
        agent_id=entry.agent_id,
        data={"entry": entry.to_event_dict()},
    )


def summary_requested(
    account_id: str,
    agent_id: str,
    thread_id: str,
    *,
    up_to_offset: int,
    from_offset: int,
    token_count: int,
    message_count: int,
    ts: int,
) -> Envelope:
    """Ask for the span ``[from_offset, up_to_offset]`` to be folded into the summary.

    The id is deterministic per (thread, span end) so a redelivered request dedupes.
    """
    return Envelope(
        type="summary.requested",
        id=f"sumreq:{account_id}/{agent_id}/{thread_id}@{up_to_offset}",
        ts=ts,
        account_id=account_id,
        agent_id=agent_id,
        thread_id=thread_id,
        data={
            "from_offset": from_offset,
            "up_to_offset": up_to_offset,
            "token_count": token_count,
            "message_count": message_count,
        },
    )


def summary_written(
    account_id: str, agent_id: str, thread_id: str, summary: Summary, ts: int
) -> Envelope:
    return Envelope(
        type="summary.written",
        id=f"sum:{account_id}/{agent_id}/{thread_id}@v{summary.version}",
        ts=ts,
        account_id=account_id,
        agent_id=agent_id,
        thread_id=thread_id,
        data={"summary": summary.to_dict()},
    )


def dead_letter(
    *,
    raw: bytes,
    error: str,
    processor: str,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    ts: int,
    account_id: str = "",
    agent_id: str = "",
    truncated: bool = False,
) -> Envelope:
    """Wrap an event a processor could not handle. ``raw`` is kept as text (lossless for JSON;
    undecodable bytes are replaced and flagged). ``truncated``: ``raw`` is only the start of
    the record (a quarantined oversized one), so it is flagged lossy too (never retried).
    A binary record (starting with a NUL byte, which no JSON text does: a sealed record of
    ``infra/data_keys.py``) is kept as base64 (``"payload_encoding": "base64"``), lossless."""
    encoding = None
    if raw[:1] == b"\x00":
        payload, lossless, encoding = base64.b64encode(raw).decode(), not truncated, "base64"
    else:
        try:
            payload, lossless = raw.decode("utf-8"), not truncated
        except UnicodeDecodeError:
            payload, lossless = raw.decode("utf-8", "replace"), False
    return Envelope(
        type="dlq.dead_letter",
        id=f"dlq:{topic}/{partition}/{offset}:{processor}",
        ts=ts,
        account_id=account_id,
        agent_id=agent_id,
        data={
            "error": error,
            "processor": processor,
            "origin_topic": topic,
            "origin_partition": partition,
            "origin_offset": offset,
            "key": key.decode("utf-8", "replace") if key is not None else None,
            "payload": payload,
            "lossless": lossless,
            **({"payload_encoding": encoding} if encoding else {}),
        },
    )


def message_of(env: Envelope) -> Message:
    """The Message carried by a ``message.appended`` event."""
    if env.type != "message.appended":
        raise DecodeError(f"expected message.appended, got {env.type}", field="type")
    return Message.from_dict(env.data)


def entry_of(env: Envelope) -> MemoryEntry:
    """The entry carried by a ``memory.*`` event."""
    raw = env.data.get("entry")
    if not isinstance(raw, Mapping):
        raise DecodeError("data.entry must be an object", field="data.entry")
    return MemoryEntry.from_dict(raw)


def summary_of(env: Envelope) -> Summary:
    raw = env.data.get("summary")
    if not isinstance(raw, Mapping):
        raise DecodeError("data.summary must be an object", field="data.summary")
    return Summary.from_dict(raw)
