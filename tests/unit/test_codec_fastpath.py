"""The codec's fast paths behave exactly like the checked readers: for valid and for
damaged input (fields missing, mistyped, booleans for integers, naive times, unknown
fields), ``decode`` / ``Message.from_dict`` / ``MemoryEntry.from_dict`` return an equal
object or raise the same error naming the same field as the reference path; the journal's
spliced ``message.appended`` encoding is byte-identical to ``encode(message_appended(...))``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstream.errors import InvalidRequest
from memstream.schemas import events, records
from memstream.schemas.records import MemoryEntry, Message

NOW = datetime(2026, 11, 29, 12, 0, 0, 123000, tzinfo=UTC)

weird = (
    st.none()
    | st.booleans()
    | st.integers(-5, 5)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(
        [
            "",
            "user",
            "tool",
            "x",
            "2026-01-01T00:00:00",
            "2026-01-01T00:00:00.5Z",
            "nope",
            "user_profile",
            "shared",
        ]
    )
    | st.lists(st.integers(-5, 5), max_size=2)
    | st.dictionaries(st.sampled_from(["id", "name", "arguments"]), st.text(max_size=3))
)
DROP = object()


def outcome(fn: Any, arg: Any) -> tuple[str, Any]:
    try:
        return ("ok", fn(arg))
    except InvalidRequest as e:
        return (type(e).__name__, (e.field, e.message))
    except Exception as e:  # the checked path may raise e.g. ValueError: so must the fast one
        return (type(e).__name__, str(e))


def damaged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in changes.items():
        if v is DROP:
            out.pop(k, None)
        else:
            out[k] = v
    return out


MESSAGE = Message(
    account_id="a",
    agent_id="b",
    thread_id="t",
    offset=3,
    message_id="m",
    role="assistant",
    content="c",
    created_at=NOW,
    token_count=2,
    seq=7,
    tool_calls=(records.ToolCall("c1", "f", {"x": 1}),),
    user_id="u",
).to_dict()
ENTRY = MemoryEntry(
    "a", "b", "k", "c", "project_fact", "shared", 0.5, "h", NOW, NOW, expires_at=NOW
).to_event_dict()


@settings(max_examples=300)
@given(st.dictionaries(st.sampled_from([*MESSAGE, "extra"]), weird | st.just(DROP), max_size=4))
def test_message_fast_path_matches_checked(changes: dict[str, Any]) -> None:
    d = orjson.loads(orjson.dumps(damaged(MESSAGE, changes), default=lambda _: None))
    assert outcome(Message.from_dict, d) == outcome(Message._from_dict_checked, d)


@settings(max_examples=300)
@given(st.dictionaries(st.sampled_from([*ENTRY, "extra"]), weird | st.just(DROP), max_size=4))
def test_entry_fast_path_matches_checked(changes: dict[str, Any]) -> None:
    d = orjson.loads(orjson.dumps(damaged(ENTRY, changes), default=lambda _: None))
    assert outcome(MemoryEntry.from_dict, d) == outcome(MemoryEntry._from_dict_checked, d)


ENVELOPE = events.encode(
    events.message_appended(Message.from_dict(MESSAGE), 1)
)  # a realistic envelope


@settings(max_examples=300)
@given(
    st.dictionaries(
        st.sampled_from(["v", "type", "id", "ts", "account_id", "agent_id", "thread_id", "data"]),
        weird | st.just(DROP) | st.sampled_from([0, 1, 2, "thread.created", {}]),
        max_size=3,
    )
)
def test_decode_fast_path_matches_checked(changes: dict[str, Any]) -> None:
    raw = orjson.dumps(damaged(orjson.loads(ENVELOPE), changes), default=lambda _: None)

    def reference(b: bytes) -> events.Envelope:
        return events._decode_checked(orjson.loads(b))

    assert outcome(events.decode, raw) == outcome(reference, raw)


def test_fast_results_are_the_records_the_constructors_build() -> None:
    msg = Message.from_dict(MESSAGE)
    assert msg == Message._from_dict_checked(MESSAGE)
    assert type(msg) is Message and type(msg.tool_calls[0]) is records.ToolCall
    with pytest.raises(AttributeError):  # still frozen
        msg.offset = 4  # type: ignore[misc]  # deliberately: it is frozen
    env = events.decode(ENVELOPE)
    assert env == events._decode_checked(orjson.loads(ENVELOPE)) and type(env) is events.Envelope
    entry = MemoryEntry.from_dict(ENTRY)
    assert entry == MemoryEntry._from_dict_checked(ENTRY)
    assert isinstance(entry.importance, float)
    assert hash(entry) == hash(MemoryEntry._from_dict_checked(ENTRY))


def test_integer_importance_becomes_a_float_as_before() -> None:
    d = dict(ENTRY, importance=1)
    assert MemoryEntry.from_dict(d).importance == 1.0
    assert type(MemoryEntry.from_dict(d).importance) is float


def test_naive_and_cached_times_are_utc() -> None:
    d = dict(MESSAGE, created_at="2026-01-02T03:04:05")
    for _ in range(2):  # second read comes from the cache
        assert Message.from_dict(d).created_at == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    with pytest.raises(InvalidRequest) as info:
        Message.from_dict(dict(MESSAGE, created_at="yesterday"))
    assert info.value.field == "created_at"


@settings(max_examples=100)
@given(
    account=st.text(max_size=12),
    agent=st.text(max_size=12),
    thread=st.text(max_size=12),
    message_id=st.text(max_size=12),
    content=st.text(max_size=50),
    ts=st.integers(0, 2**53),
)
def test_spliced_message_appended_is_byte_identical(
    account: str, agent: str, thread: str, message_id: str, content: str, ts: int
) -> None:
    msg = records.message_unchecked(
        account, agent, thread, 1, message_id, "user", content, NOW, 3, 2, None, (), None, None
    )
    expected = events.encode(events.message_appended(msg, ts))
    data = orjson.dumps(msg.to_dict())
    assert events.encode_message_appended(msg, ts, data) == expected
    tenancy = events.message_tenancy(account, agent, thread)
    assert events.encode_message_appended(msg, ts, data, tenancy) == expected
    assert msg == Message(
        account_id=account,
        agent_id=agent,
        thread_id=thread,
        offset=1,
        message_id=message_id,
        role="user",
        content=content,
        created_at=NOW,
        token_count=3,
        seq=2,
    )
