"""Where a replay reads from: a Kafka topic (no consumer group) or the journal itself.

- :class:`TopicSource` reads a topic from the log start up to end offsets taken when asked,
  with no consumer group (it commits nothing and no processor's group sees it): the bulk
  read goes through :class:`~memstream.infra.kafka.range_reader.RangeReader` (librdkafka,
  records built in C: 2.3x aiokafka's rate), the offsets through a plain ``AIOKafkaConsumer``.
  End offsets are the **high-water marks of Fetch responses**, not ``ListOffsets`` (Tansu
  answers ``ListOffsets`` wrongly when a batch holds several records; see INFRA.md); the
  same method is right on Apache Kafka.
- :class:`JournalSource` re-reads the journal's global sequence (``read_seq``) from seq 1, so
  a topic that lost data can be re-seeded. Positions are seqs on one pseudo-partition 0.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Mapping
from typing import Protocol

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from memstream.errors import InvalidRequest, RetryableInfraError
from memstream.infra.data_keys import Keyring
from memstream.infra.kafka.range_reader import RangeReader
from memstream.projections.replay import SourceBatch, SourceKind

__all__ = ["JournalSource", "SeqReader", "TopicSource"]


def _hosts(bootstrap: str) -> list[str]:
    return [h.strip().removeprefix("kafka://") for h in bootstrap.split(",") if h.strip()]


class TopicSource:
    """A topic read from its start; see the module doc."""

    kind: SourceKind = "topic"

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        timeout: float = 15.0,
        keyring: Keyring | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self._timeout = timeout
        self._keyring = keyring
        self.shredded = 0  # sealed records skipped: an erasure destroyed their key

    def _consumer(self, **kw: object) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            bootstrap_servers=_hosts(self.bootstrap),
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            **kw,
        )

    async def _partitions(self, consumer: AIOKafkaConsumer) -> list[TopicPartition]:
        parts = consumer.partitions_for_topic(self.topic)
        if not parts:
            await consumer._client.force_metadata_update()
            parts = consumer.partitions_for_topic(self.topic)
        if not parts:
            raise InvalidRequest(f"topic {self.topic} does not exist", field="topic")
        return [TopicPartition(self.topic, p) for p in sorted(parts)]

    async def starts(self) -> dict[int, int]:
        consumer = self._consumer()
        try:
            await consumer.start()
            tps = await self._partitions(consumer)
            begin = await consumer.beginning_offsets(tps)
            return {tp.partition: int(o) for tp, o in begin.items()}
        except KafkaError as e:
            raise RetryableInfraError(f"kafka: log start offsets of {self.topic}: {e}") from e
        finally:
            await consumer.stop()

    async def ends(self) -> dict[int, int]:
        consumer = self._consumer(fetch_max_wait_ms=50, max_partition_fetch_bytes=1)
        try:
            await consumer.start()
            tps = await self._partitions(consumer)
            consumer.assign(tps)
            begin = await consumer.beginning_offsets(tps)
            for tp in tps:
                consumer.seek(tp, begin[tp])
            highs: dict[int, int] = {}
            async with asyncio.timeout(self._timeout):
                while len(highs) < len(tps):
                    await consumer.getmany(*tps, timeout_ms=100, max_records=1)
                    for tp in tps:
                        hw = consumer.highwater(tp)
                        if hw is not None:
                            highs[tp.partition] = int(hw)
            return highs
        except (KafkaError, TimeoutError) as e:
            raise RetryableInfraError(f"kafka: high-water marks of {self.topic}: {e}") from e
        finally:
            await consumer.stop()

    async def read(
        self, start: Mapping[int, int], end: Mapping[int, int], batch: int
    ) -> AsyncGenerator[SourceBatch, None]:
        reader = RangeReader(_hosts(self.bootstrap), self.topic, stall_s=self._timeout)
        async with contextlib.aclosing(reader.read(start, end, batch)) as batches:
            async for got in batches:
                values = got.values
                if values and self._keyring is not None:
                    values = await self._open(self._keyring, values)
                if values or got.next:
                    yield SourceBatch(values, got.next)

    async def _open(self, keyring: Keyring, values: list[bytes]) -> list[bytes]:
        """Sealed records opened; shredded ones (key destroyed by an erasure) left out."""
        opened = await keyring.open_many(values)
        kept = [v for v in opened if v is not None]
        self.shredded += len(values) - len(kept)
        return kept


class SeqReader(Protocol):
    async def read_seq(self, after_seq: int, limit: int) -> list[tuple[int, bytes]]: ...
    async def last_seq(self) -> int: ...


class JournalSource:
    """The journal's global sequence as one pseudo-partition (0); offsets are seqs."""

    kind: SourceKind = "journal"

    def __init__(self, journal: SeqReader) -> None:
        self.journal = journal

    async def starts(self) -> dict[int, int]:
        return {0: 1}

    async def ends(self) -> dict[int, int]:
        return {0: await self.journal.last_seq() + 1}

    async def read(
        self, start: Mapping[int, int], end: Mapping[int, int], batch: int
    ) -> AsyncGenerator[SourceBatch, None]:
        after = start.get(0, 1) - 1
        stop = end.get(0, 0)
        while after + 1 < stop:
            rows = await self.journal.read_seq(after, min(batch, stop - after - 1))
            if not rows:
                return
            values = [value for seq, value in rows if seq < stop]
            if values:
                yield SourceBatch(values, {0: min(rows[-1][0], stop - 1) + 1})
            after = rows[-1][0]
