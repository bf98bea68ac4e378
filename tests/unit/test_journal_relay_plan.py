"""The relay's pure rule: journal rows -> keyed Kafka records, poison -> dead letters."""

from __future__ import annotations

from memstream.schemas.events import Envelope, decode, encode
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
    assert [k for k, _ in plan.records] == ["acc/ag/t1", "acc/ag/t2", "acc/ag/t1"]
    assert [v for _, v in plan.records] == [raw for _, raw in rows]  # re-publish is identical
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
    assert [k for k, _ in plan.records] == ["acc/ag/t1", "acc/ag/t2"]  # the others still go
    assert plan.oversized == (2,) and plan.last_seq == 3
    (letter,) = [decode(v) for _, v in plan.poison]
    assert letter.data["origin_offset"] == 2 and "quarantined" in str(letter.data["error"])
    assert letter.account_id == "acc" and letter.data["lossless"] is False  # never retried
    assert len(encode(letter)) < len(rows[1][1]) + 1_000  # a head, not the whole record


def test_a_record_at_the_limit_still_travels() -> None:
    raw = encode(env("t1", "a"))
    plan = plan_batch([(1, raw)], "p.journal", ts=5, max_record_bytes=len(raw) + len("acc/ag/t1"))
    assert plan.oversized == () and len(plan.records) == 1
