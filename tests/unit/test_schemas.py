"""The vocabulary: envelope codec round trips (hypothesis), upcasting, strict decoding that
names the field, deterministic event ids, and the window clamp."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from memstream.errors import InvalidRequest
from memstream.schemas import events
from memstream.schemas.events import DecodeError, Envelope, EventType, decode, encode
from memstream.schemas.limits import WINDOW_MESSAGES
from memstream.schemas.records import (
    JSONObject,
    MemoryEntry,
    Message,
    Role,
    Summary,
    ThreadConfig,
    ToolCall,
)

ids = st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=20)
json_scalars = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=30)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
times = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
).map(lambda t: t.replace(microsecond=(t.microsecond // 1000) * 1000))


@given(
    typ=st.sampled_from(sorted(events.EVENT_TYPES)),
    eid=ids,
    ts=st.integers(0, 2**53),
    account=ids,
    agent=ids,
    thread=st.none() | ids,
    data=st.dictionaries(st.text(max_size=8), json_values, max_size=5),
)
def test_envelope_round_trip(
    typ: EventType,
    eid: str,
    ts: int,
    account: str,
    agent: str,
    thread: str | None,
    data: JSONObject,
) -> None:
    env = Envelope(
        type=typ, id=eid, ts=ts, account_id=account, agent_id=agent, thread_id=thread, data=data
    )
    assert decode(encode(env)) == env


@given(
    offset=st.integers(0, 2**40),
    role=st.sampled_from(["system", "user", "assistant", "tool"]),
    content=st.text(max_size=200),
    reasoning=st.none() | st.text(max_size=50),
    calls=st.lists(st.builds(ToolCall, id=ids, name=ids, arguments=json_values), max_size=3),
    created=times,
    user=st.none() | ids,
)
def test_message_round_trip(
    offset: int,
    role: Role,
    content: str,
    reasoning: str | None,
    calls: list[ToolCall],
    created: datetime,
    user: str | None,
) -> None:
    msg = Message(
        account_id="a",
        agent_id="b",
        thread_id="t",
        offset=offset,
        message_id="m1",
        role=role,
        content=content,
        created_at=created,
        token_count=3,
        seq=9,
        reasoning=reasoning,
        tool_calls=tuple(calls),
        user_id=user,
    )
    env = events.message_appended(msg, ts=1)
    back = events.message_of(decode(encode(env)))
    assert back == msg
    assert env.id == "msg:m1"  # deterministic: a re-publish dedupes


@given(version=st.integers(1, 10**6), t=times, content=st.text(max_size=100))
def test_summary_round_trip(version: int, t: datetime, content: str) -> None:
    s = Summary(version, t, 10, "m", content, 5, 11)
    assert Summary.from_dict(orjson.loads(orjson.dumps(s.to_dict()))) == s
    assert set(s.to_dict()) == {
        "version",
        "timestamp",
        "last_message_offset",
        "last_message_id",
        "content",
        "token_count",
        "message_count",
    }


def test_memory_event_round_trip_and_id() -> None:
    t = datetime(2026, 1, 1, tzinfo=UTC)
    e = MemoryEntry(
        "acc", "ag", "k", "c", "user_profile", "private", 0.8, "h", t, t, user_id="u", version=3
    )
    env = events.memory_event("memory.stored", e, ts=5)
    assert events.entry_of(decode(encode(env))) == e
    assert env.id == "mem:acc/ag/u/k@3:memory.stored"


def test_upcast_v0() -> None:
    raw = orjson.dumps(
        {
            "v": 0,
            "type": "thread.created",
            "id": "x",
            "ts": 1,
            "account_id": "a",
            "agent_id": "b",
            "payload": {"k": 1},
        }
    )
    env = decode(raw)
    assert env.v == 1 and env.data == {"k": 1}


def test_unknown_fields_are_ignored() -> None:
    raw = orjson.dumps(
        {
            "v": 1,
            "type": "thread.deleted",
            "id": "x",
            "ts": 1,
            "account_id": "a",
            "agent_id": "b",
            "future": True,
        }
    )
    assert decode(raw).type == "thread.deleted"


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b"not json", "$"),
        (b"[1]", "$"),
        (b'{"v": 9, "type": "thread.created"}', "v"),
        (
            b'{"v": 1, "type": "nope", "id": "x", "ts": 1, "account_id": "a", "agent_id": "b"}',
            "type",
        ),
        (
            b'{"v": 1, "type": "thread.created", "id": 5, "ts": 1, "account_id": "a", "agent_id": "b"}',
            "id",
        ),
        (
            b'{"v": 1, "type": "thread.created", "id": "x", "ts": "1", "account_id": "a", "agent_id": "b"}',
            "ts",
        ),
        (
            b'{"v": 1, "type": "thread.created", "id": "x", "ts": 1, "account_id": "a", "agent_id": "b", "data": []}',
            "data",
        ),
    ],
)
def test_decode_errors_name_the_field(raw: bytes, field: str) -> None:
    with pytest.raises(DecodeError) as info:
        decode(raw)
    assert info.value.field == field


def test_message_of_names_missing_field() -> None:
    env = Envelope(
        type="message.appended", id="x", ts=1, account_id="a", agent_id="b", data={"role": "user"}
    )
    with pytest.raises(InvalidRequest) as info:
        events.message_of(env)
    assert info.value.field == "account_id"


@pytest.mark.parametrize(("configured", "window"), [(None, 20), (5, 5), (20, 20), (50, 20), (0, 0)])
def test_window_can_only_be_lowered(configured: int | None, window: int) -> None:
    assert ThreadConfig(configured).window() == window
    assert ThreadConfig(configured).window() <= WINDOW_MESSAGES
