"""Dispatch rules of the stream runtime (no broker: the output is an injected callable)."""

from __future__ import annotations

import errno
from collections.abc import Sequence

import asyncpg
import orjson
import pytest
import redis.exceptions
from aiokafka.errors import KafkaConnectionError

from memstream.errors import InvalidRequest, RetryableInfraError
from memstream.infra.metrics import make_metrics
from memstream.infra.outage import dependency_of
from memstream.schemas.events import Envelope, decode, encode, thread_event
from memstream.schemas.topics import JOURNAL
from memstream.streams.processor import (
    DependencyDown,
    Dispatcher,
    EventMeta,
    Processor,
    RawRecord,
    Received,
    RetryPolicy,
)

TOPIC = "p.journal"


class Flaky(Processor):
    name = "flaky"
    topic = JOURNAL

    def __init__(self, *, transient: int = 0, crash_on: frozenset[str] = frozenset()) -> None:
        self.transient = transient
        self.crash_on = crash_on
        self.handled: list[str] = []
        self.calls = 0

    async def handle(self, envelope: Envelope, meta: EventMeta) -> None:
        self.calls += 1
        if self.calls <= self.transient:
            raise RetryableInfraError("redis away")
        if envelope.thread_id in self.crash_on:
            raise ValueError("cannot apply")
        self.handled.append(envelope.thread_id or "")


class Batchy(Flaky):
    name = "batchy"
    batch_max = 10

    async def handle_batch(self, items: Sequence[Received]) -> None:
        self.calls += 1
        if self.calls <= self.transient:
            raise RetryableInfraError("clickhouse away")
        if any(i.envelope.thread_id in self.crash_on for i in items):
            raise ValueError("batch insert refused")
        self.handled += [i.envelope.thread_id or "" for i in items]


class Out:
    def __init__(self, fail_first: int = 0) -> None:
        self.records: list[tuple[str, bytes | None, bytes]] = []
        self.fail_first = fail_first

    async def __call__(self, topic: str, key: bytes | None, value: bytes) -> None:
        if self.fail_first:
            self.fail_first -= 1
            raise ConnectionError("broker away")
        self.records.append((topic, key, value))


def rec(offset: int, value: bytes, key: bytes = b"th") -> RawRecord:
    return RawRecord(EventMeta(TOPIC, 1, offset, key), value)


def ev(thread: str) -> bytes:
    return encode(thread_event("thread.created", "a", "g", thread, ts=1, event_id=thread))


def origin_offset(value: bytes) -> int:
    """The ``origin_offset`` a dead letter names."""
    offset = decode(value).data["origin_offset"]
    assert isinstance(offset, int)
    return offset


FAST = RetryPolicy(attempts=3, first_delay=0.001, max_delay=0.002)


async def test_undecodable_record_is_dead_lettered_with_origin_and_next_one_handled() -> None:
    p, out, m = Flaky(), Out(), make_metrics()
    d = Dispatcher(p, dlq_topic="p.dlq", publish=out, metrics=m, retry=FAST)
    await d.dispatch([rec(7, b"{oops")])
    await d.dispatch([rec(8, ev("t2"))])
    assert p.handled == ["t2"]
    [(topic, key, value)] = out.records
    assert (topic, key) == ("p.dlq", b"th")
    dl = decode(value)
    assert dl.type == "dlq.dead_letter"
    assert dl.data["origin_topic"] == TOPIC
    assert (dl.data["origin_partition"], dl.data["origin_offset"]) == (1, 7)
    assert dl.data["payload"] == "{oops" and dl.data["processor"] == "flaky"
    assert "field $" in str(dl.data["error"])
    assert (
        m.sample("memstream_dlq_events_total", {"processor": "flaky", "origin_topic": TOPIC}) == 1
    )
    assert m.sample("memstream_processor_events_total", {"processor": "flaky", "topic": TOPIC}) == 2


async def test_transient_errors_are_retried_then_succeed() -> None:
    p, out, m = Flaky(transient=2), Out(), make_metrics()
    await Dispatcher(p, dlq_topic="p.dlq", publish=out, metrics=m, retry=FAST).dispatch(
        [rec(1, ev("t1"))]
    )
    assert p.handled == ["t1"] and out.records == []
    assert (
        m.sample("memstream_processor_errors_total", {"processor": "flaky", "kind": "retry"}) == 2
    )


async def test_a_store_away_past_the_retries_pauses_and_dead_letters_nothing() -> None:
    """An outage is not a poison record (issue 12): past the in-place retries the dispatcher
    raises ``DependencyDown`` naming the store, and nothing goes to the DLQ."""
    p, out = Flaky(transient=99), Out()
    d = Dispatcher(p, dlq_topic="p.dlq", publish=out, metrics=make_metrics(), retry=FAST)
    with pytest.raises(DependencyDown) as err:
        await d.dispatch([rec(1, ev("t1"))])
    assert p.calls == 3 and out.records == []
    assert err.value.dependency == "valkey"  # "redis away"
    p.transient = 0  # the store is back: the same record goes through
    await d.dispatch([rec(1, ev("t1"))])
    assert p.handled == ["t1"] and out.records == []


class DriverErrors(Processor):
    """Lets a driver's own errors through, as a handler that does not translate them."""

    name = "drivers"
    topic = JOURNAL

    def __init__(self, error: Exception) -> None:
        self.error = error

    async def handle(self, envelope: Envelope, meta: EventMeta) -> None:
        raise self.error


@pytest.mark.parametrize(
    ("error", "dependency"),
    [
        (asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed"), "postgres"),
        (asyncpg.exceptions.InterfaceError("pool is closing"), "postgres"),
        (asyncpg.exceptions.AdminShutdownError("terminating connection"), "postgres"),
        (redis.exceptions.ConnectionError("Error 111 connecting"), "valkey"),
        (redis.exceptions.BusyLoadingError("loading the dataset"), "valkey"),
        (KafkaConnectionError("broker down"), "kafka"),
        (RetryableInfraError("clickhouse: cannot connect"), "clickhouse"),
        (ConnectionResetError(errno.ECONNRESET, "reset by peer"), "a dependency"),
        (TimeoutError(), "a dependency"),
    ],
)
async def test_a_drivers_outage_errors_pause_instead_of_dead_lettering(
    error: Exception, dependency: str
) -> None:
    out = Out()
    d = Dispatcher(
        DriverErrors(error), dlq_topic="p.dlq", publish=out, metrics=make_metrics(), retry=FAST
    )
    with pytest.raises(DependencyDown) as err:
        await d.dispatch([rec(1, ev("t1"))])
    assert err.value.dependency == dependency and out.records == []


@pytest.mark.parametrize(
    "error",
    [
        ValueError("cannot apply"),
        asyncpg.exceptions.DataError("invalid byte sequence"),
        redis.exceptions.ResponseError("WRONGTYPE"),
        OSError(errno.ENAMETOOLONG, "File name too long"),
    ],
)
async def test_errors_of_the_record_are_dead_lettered_at_once(error: Exception) -> None:
    out = Out()
    await Dispatcher(
        DriverErrors(error), dlq_topic="p.dlq", publish=out, metrics=make_metrics(), retry=FAST
    ).dispatch([rec(1, ev("t1"))])
    assert len(out.records) == 1


def test_dependency_of_follows_the_cause_chain() -> None:
    try:
        try:
            raise asyncpg.exceptions.CannotConnectNowError("the database system is starting up")
        except Exception as e:
            raise RetryableInfraError("opening failed") from e
    except RetryableInfraError as wrapped:
        assert dependency_of(wrapped) == "postgres"
    assert dependency_of(InvalidRequest("bad", field="data.offset")) is None
    assert dependency_of(OSError(errno.ENOSPC, "No space left on device")) == "a dependency"


async def test_handler_exception_is_dead_lettered_with_the_account() -> None:
    p, out = Flaky(crash_on=frozenset({"bad"})), Out()
    await Dispatcher(
        p, dlq_topic="p.dlq", publish=out, metrics=make_metrics(), retry=FAST
    ).dispatch([rec(3, ev("bad"))])
    dl = decode(out.records[0][2])
    assert dl.account_id == "a" and "ValueError: cannot apply" in str(dl.data["error"])
    assert orjson.loads(str(dl.data["payload"]))["thread_id"] == "bad"


async def test_failed_batch_is_split_and_only_the_bad_record_dead_lettered() -> None:
    p, out = Batchy(crash_on=frozenset({"bad"})), Out()
    records = [rec(i, ev(t)) for i, t in enumerate(["t0", "t1", "bad", "t3"])]
    await Dispatcher(
        p, dlq_topic="p.dlq", publish=out, metrics=make_metrics(), retry=FAST
    ).dispatch(records)
    assert p.handled == ["t0", "t1", "t3"]
    assert [decode(v).data["origin_offset"] for _, _, v in out.records] == [2]


async def test_a_batch_whose_store_stays_away_pauses_whole_without_splitting() -> None:
    p, out = Batchy(transient=99), Out()
    records = [rec(i, ev(f"t{i}")) for i in range(4)]
    with pytest.raises(DependencyDown):
        await Dispatcher(
            p, dlq_topic="p.dlq", publish=out, metrics=make_metrics(), retry=FAST
        ).dispatch(records)
    assert p.handled == [] and out.records == []
    assert p.calls == 3  # one batch, three tries, no per-record retries


class BadThenAway(Batchy):
    """A batch with a bad record; the store goes away while the batch is being isolated."""

    name = "bad-then-away"

    def __init__(self) -> None:
        super().__init__(crash_on=frozenset({"bad"}))
        self.away = False

    async def handle_batch(self, items: Sequence[Received]) -> None:
        if self.away and items[0].envelope.thread_id == "t3":
            raise RetryableInfraError("redis away")
        await super().handle_batch(items)


async def test_a_record_dead_lettered_before_a_pause_is_not_dead_lettered_again() -> None:
    p, out = BadThenAway(), Out()
    d = Dispatcher(p, dlq_topic="p.dlq", publish=out, metrics=make_metrics(), retry=FAST)
    records = [rec(0, b"not json")] + [rec(i, ev(t)) for i, t in [(1, "bad"), (2, "t2"), (3, "t3")]]
    p.away = True
    with pytest.raises(DependencyDown):
        await d.dispatch(records)
    assert sorted(origin_offset(v) for _, _, v in out.records) == [0, 1]
    p.away = False  # the store is back: the same batch again
    await d.dispatch(records)
    assert sorted(origin_offset(v) for _, _, v in out.records) == [0, 1]
    assert "t3" in p.handled


async def test_dead_letter_publish_is_retried_until_the_broker_answers() -> None:
    p, out = Flaky(crash_on=frozenset({"bad"})), Out(fail_first=2)
    await Dispatcher(
        p, dlq_topic="p.dlq", publish=out, metrics=make_metrics(), retry=FAST
    ).dispatch([rec(3, ev("bad"))])
    assert len(out.records) == 1


@pytest.mark.parametrize(("attempt", "expected"), [(1, 0.1), (2, 0.2), (4, 0.8), (20, 5.0)])
def test_backoff_doubles_up_to_the_cap(attempt: int, expected: float) -> None:
    assert RetryPolicy().delay(attempt) == pytest.approx(expected)


class RawBulk(Processor):
    """Parses its records itself, all-or-nothing per call (like a bulk JSON insert)."""

    name = "bulk"
    topic = JOURNAL
    raw = True
    batch_max = 100

    def __init__(self, transient: int = 0) -> None:
        self.handled: list[int] = []
        self.calls = 0
        self.transient = transient

    async def handle_raw(self, records: Sequence[RawRecord]) -> None:
        self.calls += 1
        if self.calls <= self.transient:
            raise RetryableInfraError("clickhouse away")
        for r in records:
            decode(r.value)  # raises DecodeError naming the field
        self.handled += [r.meta.offset for r in records]


async def test_a_raw_processor_gets_bytes_and_only_its_bad_record_is_dead_lettered() -> None:
    p, out, m = RawBulk(), Out(), make_metrics()
    records = [rec(0, ev("t0")), rec(1, b"{oops"), rec(2, ev("t2"))]
    await Dispatcher(p, dlq_topic="p.dlq", publish=out, metrics=m, retry=FAST).dispatch(records)
    assert p.handled == [0, 2]
    [(_, key, value)] = out.records
    dl = decode(value)
    assert key == b"th" and dl.data["origin_offset"] == 1 and dl.data["payload"] == "{oops"
    assert "DecodeError" in str(dl.data["error"]) and "field $" in str(dl.data["error"])
    assert (
        m.sample("memstream_processor_errors_total", {"processor": "bulk", "kind": "decode"}) == 1
    )
    assert m.sample("memstream_processor_events_total", {"processor": "bulk", "topic": TOPIC}) == 3


async def test_a_raw_batch_whose_store_stays_away_pauses() -> None:
    p, out = RawBulk(transient=99), Out()
    records = [rec(i, ev(f"t{i}")) for i in range(3)]
    with pytest.raises(DependencyDown) as err:
        await Dispatcher(
            p, dlq_topic="p.dlq", publish=out, metrics=make_metrics(), retry=FAST
        ).dispatch(records)
    assert err.value.dependency == "clickhouse" and out.records == [] and p.calls == 3


async def test_a_raw_batch_is_retried_whole_on_transient_errors() -> None:
    p, out = RawBulk(transient=2), Out()
    records = [rec(i, ev(f"t{i}")) for i in range(3)]
    await Dispatcher(
        p, dlq_topic="p.dlq", publish=out, metrics=make_metrics(), retry=FAST
    ).dispatch(records)
    assert p.handled == [0, 1, 2] and p.calls == 3 and out.records == []


async def test_a_dead_letter_retried_for_one_processor_is_skipped_by_the_others() -> None:
    """``memstream dlq retry --processor flaky`` re-publishes with the retry-for header:
    flaky applies it again, batchy (another group, same topic) skips it, and both still
    handle ordinary records of the same batch."""
    only_flaky = RawRecord(EventMeta(TOPIC, 1, 5, b"th", None, "flaky"), ev("retried"))
    plain = rec(6, ev("plain"))
    for proc, expected in ((Flaky(), ["retried", "plain"]), (Batchy(), ["plain"])):
        m = make_metrics()
        await Dispatcher(proc, dlq_topic="p.dlq", publish=Out(), metrics=m, retry=FAST).dispatch(
            [only_flaky, plain]
        )
        assert proc.handled == expected
        # skipped records count as processed (their offsets are committed with the batch)
        assert (
            m.sample("memstream_processor_events_total", {"processor": proc.name, "topic": TOPIC})
            == 2
        )


def test_the_retry_for_header_reaches_the_record_meta() -> None:
    from aiokafka.structs import ConsumerRecord

    from memstream.streams.consumer import raw_record
    from memstream.streams.processor import RETRY_FOR_HEADER

    r = ConsumerRecord(
        TOPIC, 0, 3, 1000, 0, b"k", b"v", None, 1, 1, [(RETRY_FOR_HEADER, b"counters")]
    )
    assert raw_record(r).meta.retry_for == "counters"
    plain = ConsumerRecord(TOPIC, 0, 4, 1000, 0, b"k", b"v", None, 1, 1, [])
    assert raw_record(plain).meta.retry_for is None
