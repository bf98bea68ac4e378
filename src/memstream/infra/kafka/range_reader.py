"""Reading a fixed range of a topic in bulk with librdkafka (confluent-kafka).

The replay reads a topic from given start offsets up to end offsets taken beforehand, with
no consumer group: nothing is committed, nothing is joined, nothing else sees it. For that
read aiokafka's per-record cost bounded ``replay messages`` (one ``ConsumerRecord``
dataclass per record built on the event loop, ~36% of the loop's time). librdkafka fetches
and decodes record batches in its own C threads, and ``Consumer.consume(num_messages=N)``
hands a whole batch over in one call: on the same topic and broker it reads 2.3x as many
records per second as aiokafka's ``getmany`` at half the CPU per record
(``bench/kafka_clients.py``; ``docs/architecture.md`` keeps the figures). The processors'
group consumers stay on aiokafka (``streams/consumer.py``).

- :func:`range_batch` is the pure rule: one ``consume`` result cut to the range, as
  values and the next position per partition, plus the partitions that reached their end.
- :class:`RangeReader` owns the librdkafka consumer: ``assign`` (no ``subscribe``, so the
  ``group.id`` librdkafka insists on is never joined; auto commit and offset store off),
  blocking calls in one worker thread of its own (a librdkafka consumer is not
  thread-safe; one thread keeps its calls in order), partitions paused once read to their
  end. Errors: a broker error on a record, or no record at all for ``stall_s`` while some
  partition is short of its end, raise :class:`~memstream.errors.RetryableInfraError`
  (the range was known to exist when its end was taken).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import Consumer, KafkaException
from confluent_kafka import TopicPartition as CkPartition

from memstream.errors import RetryableInfraError

__all__ = ["RangeBatch", "RangeReader", "range_batch"]

log = logging.getLogger(__name__)


class _Record(Protocol):
    """What :func:`range_batch` reads of a confluent-kafka ``Message``."""

    def error(self) -> object | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...
    def value(self) -> bytes | None: ...


@dataclass(frozen=True, slots=True)
class RangeBatch:
    """Values in consume order (log order per partition), the position after the last kept
    record per partition, and the partitions whose end was reached."""

    values: list[bytes]
    next: dict[int, int]
    finished: set[int]


def range_batch(records: Iterable[_Record], stops: Mapping[int, int]) -> RangeBatch:
    """``records`` cut to ``offset < stops[partition]`` (pure). A record of a partition not
    in ``stops`` (already finished) or at/after its stop is dropped; a partition is finished
    (next position: its stop) once a record at ``stop - 1`` or later is seen. A record carrying an error raises
    :class:`RetryableInfraError`. A missing value (a tombstone) is kept as ``b""``."""
    values: list[bytes] = []
    nxt: dict[int, int] = {}
    finished: set[int] = set()
    append = values.append
    for r in records:
        err = r.error()
        if err is not None:
            raise RetryableInfraError(f"kafka: {err}")
        p, off = r.partition(), r.offset()
        if p is None or off is None:
            continue
        stop = stops.get(p)
        if stop is None:
            continue
        if off >= stop:  # everything below the stop was read before it, in log order
            finished.add(p)
            nxt[p] = stop
            continue
        v = r.value()
        append(v if v is not None else b"")
        nxt[p] = off + 1
        if off + 1 >= stop:
            finished.add(p)
    return RangeBatch(values, nxt, finished)


class RangeReader:
    """One topic's partitions read from ``start`` to ``end`` (exclusive); see the module."""

    def __init__(self, bootstrap: list[str], topic: str, *, stall_s: float = 15.0) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.stall_s = stall_s

    def _consumer(self) -> Consumer:
        return Consumer(
            {
                "bootstrap.servers": ",".join(self.bootstrap),
                # required by librdkafka; only ever assigned, never subscribed: no group join
                "group.id": f"memstream-range-{uuid.uuid4().hex[:8]}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                "max.partition.fetch.bytes": 4 * 1024 * 1024,
                "fetch.wait.max.ms": 50,
                "logger": log,  # librdkafka's own log lines, instead of stderr
            }
        )

    async def read(
        self, start: Mapping[int, int], end: Mapping[int, int], batch: int
    ) -> AsyncGenerator[RangeBatch, None]:
        """Batches of at most ``batch`` records (one ``consume`` call each: librdkafka hands
        over what it has fetched, up to that) of ``start[p] <= offset < end[p]``, in log order
        per partition; ends once every partition reached its end."""
        todo = {p: e for p, e in end.items() if start.get(p, 0) < e}
        if not todo:
            return
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"range-{self.topic}")
        loop = asyncio.get_running_loop()
        want = max(batch, 1)
        try:
            consumer = await loop.run_in_executor(pool, self._consumer)
        except KafkaException as e:
            pool.shutdown(wait=False)
            raise RetryableInfraError(f"kafka: reading {self.topic}: {e}") from e
        try:
            await loop.run_in_executor(
                pool,
                consumer.assign,
                [CkPartition(self.topic, p, start.get(p, 0)) for p in todo],
            )

            def step(stops: dict[int, int]) -> RangeBatch:
                # consume and cut in the worker: the loop gets lists, not per-record objects
                return range_batch(consumer.consume(num_messages=want, timeout=0.5), stops)

            def reached(stops: dict[int, int]) -> set[int]:
                # a partition whose last offsets hold no record (a control batch, a
                # compacted tail) is done once its position is at its end
                pos = consumer.position([CkPartition(self.topic, p) for p in stops])
                return {tp.partition for tp in pos if tp.offset >= stops[tp.partition]}

            quiet_since = time.monotonic()
            while todo:
                got = await loop.run_in_executor(pool, step, dict(todo))
                if got.finished:
                    for p in got.finished:
                        todo.pop(p, None)
                    await loop.run_in_executor(
                        pool, consumer.pause, [CkPartition(self.topic, p) for p in got.finished]
                    )
                if got.values or got.next:
                    quiet_since = time.monotonic()
                    yield got
                elif todo:
                    done = await loop.run_in_executor(pool, reached, dict(todo))
                    if done:
                        ends = {p: todo.pop(p) for p in done}
                        await loop.run_in_executor(
                            pool, consumer.pause, [CkPartition(self.topic, p) for p in done]
                        )
                        yield RangeBatch([], ends, done)
                    elif time.monotonic() - quiet_since >= self.stall_s:
                        raise RetryableInfraError(
                            f"kafka: no records of {self.topic} for {self.stall_s:.0f} s, "
                            f"partitions {sorted(todo)} short of their end"
                        )
        except KafkaException as e:
            raise RetryableInfraError(f"kafka: reading {self.topic}: {e}") from e
        finally:
            with contextlib.suppress(KafkaException, RuntimeError):
                await loop.run_in_executor(pool, consumer.close)
            pool.shutdown(wait=False)
