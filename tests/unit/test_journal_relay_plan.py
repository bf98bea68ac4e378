"""The relay's pure rule: journal rows -> keyed Kafka records, poison -> dead letters."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from memstream.schemas.count_header import COUNT_HEADER, read_count_header
from memstream.schemas.events import Envelope, decode, encode, message_appended
from memstream.schemas.records import Message
from memstream.streams.journal_relay import plan_batch, thread_key


def env(thread: str | None, eid: str) -> Envelope:
    return Envelope(
        type="thread.created" if thread else "thread.deleted",
        id=eid,
        ts=1,
        account_id="acc",
        agent_id="ag",
        thread_id=thread,
    )


def test_records_are_keyed_by_thread_and_published_byte_for_byte() -> None:
    rows = [(7, encode(env("t1", "a"))), (8, encode(env("t2", "b"))), (9, encode(env("t1", "c")))]
    plan = plan_batch(rows, "p.journal", ts=5)
    assert [k for k, _, _ in plan.records] == ["acc/ag/t1", "acc/ag/t2", "acc/ag/t1"]
    assert [v for _, v, _ in plan.records] == [raw for _, raw in rows]  # re-publish is identical
    assert [h for _, _, h in plan.records] == [(), (), ()]  # not messages: nothing to count
    assert plan.last_seq == 9
    assert plan.poison == []


def test_poison_becomes_a_dead_letter_naming_its_seq_and_the_bad_field() -> None:
    rows = [(1, encode(env("t1", "a"))), (2, b'{"v":1,"type":"nope"}'), (3, b"\xff")]
    plan = plan_batch(rows, "p.journal", ts=5)
    assert len(plan.records) == 1
    assert plan.last_seq == 3  # the watermark moves past poison: the relay never sticks
    letters = [decode(v) for _, v in plan.poison]
    assert [d.data["origin_offset"] for d in letters] == [2, 3]
    assert letters[0].type == "dlq.dead_letter"
    assert "type" in str(letters[0].data["error"])
    assert letters[1].data["lossless"] is False


def test_thread_key_without_thread_falls_back_to_agent() -> None:
    assert thread_key(env(None, "x")) == "acc/ag"


def test_empty_batch_plans_nothing() -> None:
    plan = plan_batch([], "p.journal", ts=0)
    assert plan.records == [] and plan.poison == [] and plan.last_seq == 0


def test_an_oversized_record_is_quarantined_by_reference_and_the_rest_goes_on() -> None:
    big = Envelope(
        type="thread.created",
        id="big",
        ts=1,
        account_id="acc",
        agent_id="ag",
        thread_id="t9",
        data={"blob": "é" * 600},
    )
    rows = [(1, encode(env("t1", "a"))), (2, encode(big)), (3, encode(env("t2", "b")))]
    plan = plan_batch(rows, "p.journal", ts=5, max_record_bytes=1_000)
    assert [k for k, _, _ in plan.records] == ["acc/ag/t1", "acc/ag/t2"]  # the others still go
    assert plan.oversized == (2,) and plan.last_seq == 3
    (letter,) = [decode(v) for _, v in plan.poison]
    assert letter.data["origin_offset"] == 2 and "quarantined" in str(letter.data["error"])
    assert letter.account_id == "acc" and letter.data["lossless"] is False  # never retried
    assert len(encode(letter)) < len(rows[1][1]) + 1_000  # a head, not the whole record


def test_a_record_at_the_limit_still_travels() -> None:
    raw = encode(env("t1", "a"))
    plan = plan_batch([(1, raw)], "p.journal", ts=5, max_record_bytes=len(raw) + len("acc/ag/t1"))
    assert plan.oversized == () and len(plan.records) == 1


def appended(thread: str, offset: int, tokens: int) -> bytes:
    msg = Message(
        "acc",
        "ag",
        thread,
        offset,
        f"m{offset}",
        "user",
        "some words",
        datetime.now(UTC),
        token_count=tokens,
    )
    return encode(message_appended(msg, 1))


def test_a_message_travels_with_its_count_header_taken_from_its_envelope() -> None:
    rows = [(1, appended("t/1", 4, 17)), (2, encode(env("t1", "a"))), (3, appended("t2", 0, 0))]
    plan = plan_batch(rows, "p.journal", ts=5)
    headers = [h for _, _, h in plan.records]
    assert [[name for name, _ in h] for h in headers] == [[COUNT_HEADER], [], [COUNT_HEADER]]
    assert read_count_header(headers[0][0][1]) == (("acc", "ag", "t/1"), 4, 17)
    assert read_count_header(headers[2][0][1]) == (("acc", "ag", "t2"), 0, 0)
    assert plan_batch(rows, "p.journal", ts=9).records == plan.records  # re-publish: identical


def test_the_count_header_counts_toward_the_bus_limit() -> None:
    raw = appended("t1", 4, 17)
    (_, _, ((_, header),)) = plan_batch([(1, raw)], "p.journal", ts=5).records[0]
    bare = len(raw) + len("acc/ag/t1")
    assert plan_batch([(1, raw)], "p.journal", ts=5, max_record_bytes=bare).oversized == (1,)
    limit = bare + len(COUNT_HEADER) + len(header) + 10
    assert plan_batch([(1, raw)], "p.journal", ts=5, max_record_bytes=limit).oversized == ()


def test_a_pass_waits_out_the_linger_only_right_after_another() -> None:
    from memstream.streams.journal_relay import linger_left

    assert linger_left(now=10.002, last_pass_end=10.0, linger_s=0.005) == pytest.approx(0.003)
    assert linger_left(now=10.005, last_pass_end=10.0, linger_s=0.005) == 0.0
    assert linger_left(now=11.0, last_pass_end=10.0, linger_s=0.005) == 0.0  # after a quiet
    assert linger_left(now=10.0, last_pass_end=float("-inf"), linger_s=0.005) == 0.0  # first
    assert linger_left(now=10.001, last_pass_end=10.0, linger_s=0.0) == 0.0  # off
