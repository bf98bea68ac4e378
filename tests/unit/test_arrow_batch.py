"""The Arrow bulk parse gives exactly the rows and positions of the Python path, or declines.

The property: whenever :func:`parse_journal_values` vouches for a batch (no ``KIND_PYTHON``
row), decoding the same records in Python succeeds and ``rows_of_batch`` /
``thread_positions`` give the same rows, in the same order, and the same positions. Whenever
the Python path rejects a record, the Arrow path declines the batch (so the record is named
and dead-lettered by the Python path).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memstream.projections.messages.arrow_batch import parse_journal_values
from memstream.projections.messages.rows import messages_table, split_journal_batch
from memstream.projections.messages.sql import KIND_PYTHON
from memstream.schemas.events import DecodeError, decode, encode, message_appended, thread_event
from memstream.schemas.records import Message, Role, ToolCall
from memstream.streams.message_projector import rows_of_batch, thread_positions

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def msg(
    thread: str, offset: int, role: Role, content: str, *, seq: int | None = None, **kw: Any
) -> Message:
    return Message(
        account_id="acc",
        agent_id="ag",
        thread_id=thread,
        offset=offset,
        message_id=f"{thread}-{offset}",
        role=role,
        content=content,
        created_at=T0 + timedelta(milliseconds=offset * 1_001),
        seq=100 + offset if seq is None else seq,
        **kw,
    )


def enc(m: Message) -> bytes:
    return encode(message_appended(m, ts=1))


def python_path(values: list[bytes]) -> tuple[pa.Table, dict[str, int]]:
    envs = [decode(v) for v in values]
    return messages_table(rows_of_batch(envs)), thread_positions(envs)


def arrow_path(values: list[bytes]) -> tuple[pa.Table, dict[str, int]] | None:
    parsed = parse_journal_values(values)
    if parsed is None or pc.any(pc.equal(parsed.column("kind"), KIND_PYTHON)).as_py():
        return None
    batch = split_journal_batch(parsed)
    return batch.messages, batch.positions


def assert_same(values: list[bytes]) -> None:
    fast = arrow_path(values)
    assert fast is not None, "the Arrow path should vouch for this batch"
    rows, positions = python_path(values)
    assert fast[0].equals(rows), (fast[0].to_pylist(), rows.to_pylist())
    assert fast[1] == positions


def variant(m: Message, **data: object) -> bytes:
    env = orjson.loads(enc(m))
    env["data"].update(data)
    return orjson.dumps(env)


def test_canonical_batch_gives_the_python_rows_and_positions() -> None:
    values = [
        enc(msg("t1", 0, "system", "system prompt")),
        enc(msg("t1", 1, "user", 'Grüße "quoted" \\ back\nslash\ttab \u0000 😀 ü', user_id="u1")),
        enc(
            msg(
                "t1",
                2,
                "assistant",
                "calling",
                reasoning="hidden",
                tool_calls=(ToolCall("c1", "f", {"x": 1}), ToolCall("c2", "g", {})),
            )
        ),
        enc(msg("t1", 3, "tool", "tool output", tool_call_id="c1")),
        encode(thread_event("thread.created", "acc", "ag", "t3", ts=1)),
        enc(msg("t2", 0, "user", "中文 العربية", user_id="u2")),
        enc(msg("t1", 1, "user", "a redelivery, mid-batch, keeps the first row")),
        enc(msg("t2", 5, "assistant", "after the duplicate")),
        enc(msg("t4", 0, "tool", "a thread with positions only", seq=7)),
    ]
    assert_same(values)
    fast = arrow_path(values)
    assert fast is not None
    assert fast[0].column("offset").to_pylist() == [1, 2, 0, 5]  # first copy of t1:1 kept
    assert fast[0].column("tool_call_ids").to_pylist() == [[], ["c1", "c2"], [], []]


def test_event_ids_come_back_when_asked() -> None:
    values = [enc(msg("t1", 0, "user", "a")), enc(msg("t1", 1, "system", "b"))]
    parsed = parse_journal_values(values, event_id=True)
    assert parsed is not None
    assert parsed.column("event_id").to_pylist() == ["msg:t1-0", "msg:t1-1"]


BASE = msg("t1", 1, "user", "bad one")
ODD: dict[str, bytes] = {
    "not json": b"{not json",
    "two objects": b'{"v":1}{"v":1}',
    "offset as float": variant(BASE, offset=1.5),
    "offset as string": variant(BASE, offset="1"),
    "offset negative": variant(BASE, offset=-1),
    "offset huge": variant(BASE, offset=2**63),
    "seq as bool": variant(BASE, seq=True),
    "seq missing": orjson.dumps(
        {**orjson.loads(enc(BASE)), "data": {k: v for k, v in BASE.to_dict().items() if k != "seq"}}
    ),
    "unknown role": variant(BASE, role="robot"),
    "role missing": variant(BASE, role=None),
    "role a list": variant(BASE, role=["user"]),
    "foreign account": variant(BASE, account_id="other"),
    "content number": variant(BASE, content=5),
    "content null": variant(BASE, content=None),
    "user_id number": variant(BASE, user_id=3),
    "tool call without id": variant(BASE, tool_calls=[{"name": "x"}]),
    "tool call null": variant(BASE, tool_calls=[None]),
    "tool calls object": variant(BASE, tool_calls={}),
    "created_at with offset": variant(BASE, created_at="2026-03-01T01:00:00+01:00"),
    "created_at 30 February": variant(BASE, created_at="2026-02-30T00:00:00.000Z"),
    "created_at leap second": variant(BASE, created_at="2026-06-30T23:59:60.000Z"),
    "created_at year 0": variant(BASE, created_at="0000-01-01T00:00:00.000Z"),
    "created_at number": variant(BASE, created_at=1),
    "data null": orjson.dumps({**orjson.loads(enc(BASE)), "data": None}),
    "data missing": orjson.dumps({k: v for k, v in orjson.loads(enc(BASE)).items() if k != "data"}),
    "v 0 (upcast)": orjson.dumps({**orjson.loads(enc(BASE)), "v": 0}),
    "v 2": orjson.dumps({**orjson.loads(enc(BASE)), "v": 2}),
    "unknown type": orjson.dumps({**orjson.loads(enc(BASE)), "type": "x.y"}),
    "ts string": orjson.dumps({**orjson.loads(enc(BASE)), "ts": "1"}),
    "repeated field": enc(BASE)[:-1] + b',"v":1}',
    "NaN in an unread field": enc(BASE)[:-1] + b',"extra":NaN}',
    "Infinity in an unread field": enc(BASE)[:-1] + b',"extra":[-Infinity]}',
    "invalid UTF-8 in an unread field": enc(BASE)[:-1] + b',"extra":"\xff"}',
    "lone surrogate": enc(BASE)[:-1] + b',"extra":"\\ud800"}',
    "raw control character": enc(BASE)[:-1] + b',"extra":"a\tb"}',
    "byte order mark": b"\xef\xbb\xbf" + enc(BASE),
    "trailing space": enc(BASE) + b" ",
}


@pytest.mark.parametrize("name", sorted(ODD))
def test_an_odd_record_sends_the_batch_to_the_python_path(name: str) -> None:
    values = [enc(msg("t1", 0, "user", "fine")), ODD[name]]
    assert arrow_path(values) is None
    # the Python path reads it or names the field it cannot read, as before
    try:
        python_path(values)
    except DecodeError as e:
        assert e.field


def test_a_string_that_only_looks_like_nan_is_declined_not_misread() -> None:
    values = [enc(msg("t1", 0, "user", "values: NaN, [Infinity"))]
    assert arrow_path(values) is None  # a false alarm costs the Python path, nothing else
    assert arrow_path([enc(msg("t1", 0, "user", "NaN and Infinity"))]) is not None


# --- property: vouched for => identical; rejected by Python => declined ------------------------
_json_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
    st.lists(st.integers(0, 3), max_size=2),
    # fresh objects per draw (``st.just`` would hand out one shared dict, which a later
    # mutation can put inside itself: a cycle orjson refuses with "Recursion limit")
    st.builds(dict),
    st.builds(lambda: [{"id": "c"}]),
    st.builds(lambda: [{"id": None}]),
    st.sampled_from(
        [
            "2026-03-01T12:00:00.000Z",
            "2026-03-01T12:00:00Z",
            "1999-12-31T23:59:59.999Z",
            "2026-13-01T00:00:00.000Z",
            "acc",
            "ag",
            "user",
            "assistant",
            "system",
            "tool",
        ]
    ),
)
_data_fields = (
    "account_id",
    "agent_id",
    "thread_id",
    "offset",
    "message_id",
    "seq",
    "role",
    "content",
    "user_id",
    "tool_calls",
    "created_at",
)
_envelope_fields = ("v", "type", "id", "ts", "account_id", "agent_id", "thread_id", "data")


@st.composite
def records(draw: st.DrawFn) -> bytes:
    roles: list[Role] = ["user", "assistant", "system", "tool"]
    role = draw(st.sampled_from(roles))
    thread = draw(st.sampled_from(["t1", "t2", "ü"]))
    m = msg(
        thread,
        draw(st.integers(0, 3)),
        role,
        draw(st.text(max_size=20)),
        user_id=draw(st.sampled_from([None, "u1", "ü2"])),
        tool_calls=tuple(ToolCall(f"c{i}", "f", {}) for i in range(draw(st.integers(0, 2)))),
    )
    env: dict[str, Any] = orjson.loads(enc(m))
    if draw(st.integers(0, 3)) == 0:  # a thread event now and then
        env = orjson.loads(encode(thread_event("thread.created", "acc", "ag", thread, ts=1)))
    fields: tuple[str, ...]
    for _ in range(max(0, draw(st.integers(-5, 2)))):  # mutations, in one record of three
        if draw(st.booleans()):
            target, fields = env["data"] if isinstance(env.get("data"), dict) else env, _data_fields
        else:
            target, fields = env, _envelope_fields
        name = draw(st.sampled_from(fields))
        if draw(st.integers(0, 4)) == 0:
            target.pop(name, None)
        else:
            target[name] = draw(_json_values)
    return orjson.dumps(env)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(records(), min_size=1, max_size=6))
def test_vouched_for_means_identical_to_the_python_path(values: list[bytes]) -> None:
    fast = arrow_path(values)
    try:
        slow = python_path(values)
    except (DecodeError, OverflowError, pa.ArrowException):
        assert fast is None, "the Arrow path vouched for a batch the Python path rejects"
        return
    if fast is not None:
        assert fast[0].equals(slow[0]), (fast[0].to_pylist(), slow[0].to_pylist())
        assert fast[1] == slow[1]
