"""What the counters processor reads from a ``message.appended``: thread, offset, tokens
(from a decoded envelope, and from the undecoded record)."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import pytest

from memstream.errors import InvalidRequest
from memstream.infra import redis_keys
from memstream.infra.thread_state import COUNTERS
from memstream.schemas.count_header import COUNT_HEADER, count_header, read_count_header
from memstream.schemas.events import DecodeError, Envelope, decode, encode, message_appended
from memstream.schemas.records import JSONObject, JSONValue, Message, ThreadRef
from memstream.streams.counters import read_step, record_step, to_count
from memstream.streams.processor import EventMeta, RawRecord


def appended(**overrides: JSONValue) -> Envelope:
    msg = Message(
        account_id="acc",
        agent_id="agent",
        thread_id="th",
        offset=7,
        message_id="m7",
        role="user",
        content="hello",
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        token_count=12,
    )
    env = message_appended(msg, 1)
    data = dict(env.data)
    data.update(overrides)
    return Envelope(env.type, env.id, env.ts, env.account_id, env.agent_id, env.thread_id, data)


def test_a_message_counts_for_its_thread_at_its_offset_with_its_tokens() -> None:
    assert to_count(appended()) == (ThreadRef("acc", "agent", "th"), 7, 12)
    assert to_count(appended(token_count=None))[2] == 0


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"offset": "7"}, "data.offset"),
        ({"thread_id": None}, "data.thread_id"),
        ({"token_count": 1.5}, "data.token_count"),
        ({"token_count": True}, "data.token_count"),
    ],
)
def test_a_malformed_message_names_the_field(overrides: JSONObject, field: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        to_count(appended(**overrides))
    assert e.value.field == field


def test_the_batch_script_builds_the_same_keys_as_redis_keys() -> None:
    # thread_state's batch count script gets only thread_base(ref) and appends the names.
    ref = ThreadRef("acc {x}", "agent*", "th:1")
    base = redis_keys.thread_base(ref)
    assert base + COUNTERS == redis_keys.counters(ref)
    assert base + "summarized" == redis_keys.watermark(ref)
    assert base + "counted:" + str(42) == redis_keys.message_claim(ref, 42)


def raw(env: Envelope, **top: object) -> bytes:
    d: dict[str, object] = dict(env.to_dict())
    d.update(top)
    return orjson.dumps({k: v for k, v in d.items() if v is not DROP})


DROP = object()


def test_an_undecoded_record_reads_like_decode_then_to_count() -> None:
    assert read_step(encode(appended())) == (("acc", "agent", "th"), 7, 12)
    step = read_step(encode(appended(token_count=None)))
    assert step is not None and step[2] == 0
    assert read_step(raw(appended(), v=DROP)) == (("acc", "agent", "th"), 7, 12)  # v0, upcast
    other = Envelope("thread.created", "e1", 1, "acc", "agent", "th", {})
    assert read_step(encode(other)) is None


@pytest.mark.parametrize(
    ("record", "error", "field"),
    [
        (b"{not json", DecodeError, "$"),
        (raw(appended(), id=5), DecodeError, "id"),
        (raw(appended(), data=[1]), DecodeError, "data"),
        (raw(appended(), v=9), DecodeError, "v"),
        (encode(appended(offset="7")), InvalidRequest, "data.offset"),
        (encode(appended(offset=True)), InvalidRequest, "data.offset"),
        (encode(appended(thread_id=None)), InvalidRequest, "data.thread_id"),
        (encode(appended(token_count=True)), InvalidRequest, "data.token_count"),
    ],
)
def test_a_damaged_record_fails_as_decode_then_to_count_would(
    record: bytes, error: type[Exception], field: str
) -> None:
    with pytest.raises(error) as e:
        read_step(record)
    assert getattr(e.value, "field", None) == field


# --- the count header (schemas.count_header): what the relay attaches, what the counters read


def record(value: bytes, headers: tuple[tuple[str, bytes], ...] = ()) -> RawRecord:
    return RawRecord(EventMeta("p.journal", 0, 3, b"acc/agent/th"), value, headers)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"token_count": None},
        {"token_count": 0},
        {"thread_id": "a/b\\"},
        {"account_id": "é\u2028\x00", "offset": 2**40},
    ],
)
def test_the_count_header_reads_what_the_envelope_says(overrides: JSONObject) -> None:
    env = appended(**overrides)
    raw = encode(env)
    header = count_header(env)
    assert header is not None
    assert read_count_header(header) == read_step(raw)
    assert record_step(record(raw, ((COUNT_HEADER, header),))) == read_step(raw)


def test_a_record_without_a_count_header_is_counted_from_its_envelope() -> None:
    raw = encode(appended())
    assert record_step(record(raw)) == (("acc", "agent", "th"), 7, 12)
    assert record_step(record(raw, (("other", b"x"),))) == (("acc", "agent", "th"), 7, 12)


@pytest.mark.parametrize(
    "header",
    [
        b"",
        b"not json",
        b'{"a":1}',
        b'["acc","agent","th",7]',
        b'["acc","agent","th",7,12,0]',
        b'["acc","agent","th","7",12]',
        b'["acc","agent","th",7,1.5]',
        b'["acc","agent","th",7,true]',
        b'["acc","agent",null,7,12]',
    ],
)
def test_an_unreadable_count_header_falls_back_to_the_envelope(header: bytes) -> None:
    raw = encode(appended())
    assert read_count_header(header) is None
    assert record_step(record(raw, ((COUNT_HEADER, header),))) == (("acc", "agent", "th"), 7, 12)


def test_an_unreadable_count_header_on_a_bad_envelope_still_names_the_field() -> None:
    raw = encode(appended(offset="7"))
    assert count_header(decode(raw)) is None  # the relay attaches none: the envelope decides
    with pytest.raises(InvalidRequest) as e:
        record_step(record(raw, ((COUNT_HEADER, b"junk"),)))
    assert e.value.field == "data.offset"


def test_other_events_carry_no_count_header() -> None:
    env = Envelope("thread.created", "x", 1, "acc", "agent", "th")
    assert count_header(env) is None
    assert record_step(record(encode(env))) is None
