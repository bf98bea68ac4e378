"""The journal key layout: round trips, ordering, prefix-freedom, message ids."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memstream.errors import InvalidRequest
from memstream.infra.journal import keys
from memstream.infra.journal.codec import (
    ToolCallRecord,
    decode_seq_block,
    decode_tool_call,
    encode_seq_block,
    encode_tool_call,
)
from memstream.schemas.records import ThreadRef

ids = st.text(min_size=0, max_size=20)  # any text, NUL and "/" included
refs = st.builds(ThreadRef, ids, ids, ids)
u64s = st.integers(min_value=0, max_value=keys.U64_MAX)


@given(refs, u64s)
def test_message_key_round_trip(ref: ThreadRef, offset: int) -> None:
    key = keys.message_key(ref, offset)
    assert keys.decode_message_key(key) == (ref, offset)
    assert key.startswith(keys.thread_prefix(ref))


@given(refs, u64s, u64s)
def test_offsets_sort_like_integers(ref: ThreadRef, a: int, b: int) -> None:
    ka, kb = keys.message_key(ref, a), keys.message_key(ref, b)
    assert (ka < kb) == (a < b)


@given(u64s, u64s)
def test_seqs_sort_like_integers_and_round_trip(a: int, b: int) -> None:
    assert (keys.seq_key(a) < keys.seq_key(b)) == (a < b)
    assert keys.decode_seq_key(keys.seq_key(a)) == a


@given(refs, refs, u64s)
def test_a_thread_prefix_never_matches_another_thread(
    r1: ThreadRef, r2: ThreadRef, off: int
) -> None:
    if r1 != r2:
        assert not keys.message_key(r2, off).startswith(keys.thread_prefix(r1))


@given(refs, refs, u64s)
def test_thread_event_keys_round_trip_and_stay_in_their_thread(
    r1: ThreadRef, r2: ThreadRef, seq: int
) -> None:
    assert keys.decode_thread_event_key(keys.thread_event_key(r1, seq)) == (r1, seq)
    if r1 != r2:
        assert not keys.thread_event_key(r2, seq).startswith(keys.thread_events_prefix(r1))


@given(refs, refs)
def test_thread_prefixes_sort_like_the_id_tuples(r1: ThreadRef, r2: ThreadRef) -> None:
    t1 = (r1.account_id, r1.agent_id, r1.thread_id)
    t2 = (r2.account_id, r2.agent_id, r2.thread_id)
    assert (keys.thread_prefix(r1) < keys.thread_prefix(r2)) == (t1 < t2)


@given(ids, ids, ids, ids)
def test_tool_call_key_round_trip(account: str, agent: str, call: str, thread: str) -> None:
    key = keys.tool_call_key(account, agent, call, thread)
    assert keys.decode_tool_call_key(key) == (account, agent, call, thread)
    assert key.startswith(keys.tool_call_prefix(account, agent, call))


@given(ids, ids, ids, ids)
def test_one_ids_prefix_never_covers_another_id(a: str, b: str, c1: str, c2: str) -> None:
    """``call_1``'s prefix scan never returns ``call_10``'s records (nor ``call_1\x00``)."""
    if c1 != c2:
        assert not keys.tool_call_key(a, b, c2, "t").startswith(keys.tool_call_prefix(a, b, c1))


def test_a_tool_call_key_from_before_threads_decodes_without_thread() -> None:
    assert keys.decode_tool_call_key(keys.tool_call_prefix("a", "b", "c")) == ("a", "b", "c", None)


def test_tricky_ids_stay_apart() -> None:
    pairs = [
        (ThreadRef("a", "b", "c/d"), ThreadRef("a", "b/c", "d")),
        (ThreadRef("a", "b", "c"), ThreadRef("a", "b", "c\x00")),
        (ThreadRef("a", "b", ""), ThreadRef("a", "", "b")),
    ]
    for r1, r2 in pairs:
        assert keys.thread_prefix(r1) != keys.thread_prefix(r2)
        assert not keys.thread_prefix(r2).startswith(keys.thread_prefix(r1))


def test_keyspaces_do_not_overlap() -> None:
    ref = ThreadRef("s", "t", "w")
    tags = {
        keys.message_key(ref, 0)[:1],
        keys.seq_key(1)[:1],
        keys.tool_call_key("a", "b", "c", "t")[:1],
        keys.thread_event_key(ref, 1)[:1],
        keys.RELAY_WATERMARK[:1],
    }
    assert len(tags) == 5
    assert keys.EVENTS_INDEXED_FROM[:1] == keys.RELAY_WATERMARK[:1]


def test_out_of_range_offsets_name_the_field() -> None:
    with pytest.raises(InvalidRequest) as e:
        keys.message_key(ThreadRef("a", "b", "c"), -1)
    assert e.value.field == "offset"
    with pytest.raises(InvalidRequest) as e:
        keys.seq_key(2**64)
    assert e.value.field == "seq"


@given(
    st.integers(min_value=0, max_value=2**48 - 1),
    st.integers(min_value=0, max_value=keys.ENTROPY_MAX),
    st.integers(min_value=0, max_value=2**48 - 1),
    st.integers(min_value=0, max_value=keys.ENTROPY_MAX),
)
def test_message_ids_sort_by_time_then_entropy(m1: int, e1: int, m2: int, e2: int) -> None:
    a, b = keys.message_id(m1, e1), keys.message_id(m2, e2)
    assert len(a) == 32
    assert (a < b) == ((m1, e1) < (m2, e2))


@given(
    st.builds(
        ToolCallRecord,
        name=st.none() | st.text(),
        arguments=st.none()
        | st.text()
        | st.dictionaries(st.text(), st.integers(min_value=-(2**63), max_value=2**63 - 1)),
        result=st.none() | st.text(),
        thread_id=st.none() | st.text(),
        offset=st.none() | st.integers(min_value=0, max_value=2**62),
    )
)
def test_tool_call_record_round_trip(rec: ToolCallRecord) -> None:
    assert decode_tool_call(encode_tool_call(rec)) == rec


@given(st.lists(st.binary(max_size=300), max_size=20))
def test_seq_block_round_trip(envelopes: list[bytes]) -> None:
    assert decode_seq_block(encode_seq_block(envelopes)) == envelopes


def test_truncated_seq_block_is_an_error() -> None:
    raw = encode_seq_block([b"abc", b"defg"])
    with pytest.raises(ValueError, match="truncated"):
        decode_seq_block(raw[:-1])
