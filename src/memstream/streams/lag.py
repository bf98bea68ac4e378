"""Consumer lag per group and partition, with true numbers on Apache Kafka and on Tansu.

:func:`consumer_lag` answers, for each consumer group and each partition of the topics it
reads: the committed offset, the end offset (high-water mark), the lag, and the time since
the group last committed when that is known.

How the numbers are obtained, and why:

- End offsets come from the **high-water mark of a Fetch response**, not from
  ``ListOffsets`` (``end_offsets()``): Tansu answers ``ListOffsets`` with a wrong value when
  the last batch holds several records. A group-less consumer is assigned every partition,
  positioned at the beginning with a one-byte fetch size, and polled until each partition
  has reported its high-water mark. Works the same on Apache Kafka.
- Committed offsets come from ``OffsetFetch`` with the partitions listed explicitly
  (Tansu drops the connection when the list is omitted). A partition the group never
  committed counts as committed at its log start offset (everything is lag).
- Kafka does not expose when a group committed, so our consumers write the commit's wall
  time into its metadata (``t=<unix s>``), and ``since_commit_s`` is read from there, in any
  process (``memstream lag``). ``last_commit`` (group -> unix time) overrides it for a
  caller that knows (the runner records each commit of the processors it hosts);
  :class:`LagWatcher` derives it across calls from when the committed offset last moved
  (``memstream lag --watch``). Otherwise ``since_commit_s`` is None.

:func:`processor_groups` maps processor names and their input topics to group ids.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import OffsetAndMetadata

from memstream.errors import InvalidRequest
from memstream.infra.kafka.failures import KAFKA_FAILURES, translate
from memstream.infra.settings import Settings
from memstream.schemas.topics import Topics
from memstream.streams.consumer import commit_time
from memstream.streams.coverage import PartitionKey, Ranges, holes

__all__ = [
    "CoverageLoader",
    "LagRow",
    "LagWatcher",
    "bootstrap_hosts",
    "consumer_lag",
    "end_offsets",
    "max_gap",
    "max_lag",
    "processor_groups",
    "topic_records",
]

#: reads what each group applied (``CoverageStore.load_groups``), None when unknown
CoverageLoader = Callable[[], Awaitable[Mapping[PartitionKey, Ranges] | None]]


@dataclass(frozen=True, slots=True)
class LagRow:
    """Lag of one group on one partition. ``committed`` is None if the group never committed."""

    group: str
    topic: str
    partition: int
    committed: int | None
    end_offset: int
    lag: int
    since_commit_s: float | None = None
    gap: int | None = None
    """Records below ``committed`` the group never applied (``streams.coverage``); None
    when its coverage is unknown (no store given, or the partition never recorded)."""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def processor_groups(
    settings: Settings, processors: Mapping[str, str | Sequence[str]]
) -> dict[str, list[str]]:
    """``{"counters": "journal"}`` -> ``{"memstream-counters": ["memstream.journal"]}``.

    Topics are given as suffixes (``memstream.schemas.topics``) and get the settings' prefix.
    """
    from memstream.streams.consumer import group_id

    topics = Topics(settings.topic_prefix)
    out: dict[str, list[str]] = {}
    for name, suffixes in processors.items():
        seq = [suffixes] if isinstance(suffixes, str) else list(suffixes)
        out[group_id(settings, name)] = [topics.prefix + s for s in seq]
    return out


def bootstrap_hosts(bootstrap: str) -> list[str]:
    hosts = [h.strip().removeprefix("kafka://") for h in bootstrap.split(",") if h.strip()]
    if not hosts:
        raise InvalidRequest("kafka bootstrap address is empty", field="kafka_bootstrap")
    return hosts


async def end_offsets(
    bootstrap: str, topics: Iterable[str], *, timeout: float = 10.0
) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
    """(log start offsets, high-water marks) of every partition of ``topics``.

    Raises ``InvalidRequest(field="topics")`` for a topic the broker does not know and
    ``RetryableInfraError`` if a high-water mark is not reported within ``timeout``.
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap_hosts(bootstrap),
        group_id=None,
        enable_auto_commit=False,
        fetch_max_wait_ms=50,
        max_partition_fetch_bytes=1,
        auto_offset_reset="earliest",
    )
    try:
        await consumer.start()  # in the try: a broker that is down is an InfraError too
        tps: list[TopicPartition] = []
        for topic in dict.fromkeys(topics):
            parts = await _partitions(consumer, topic)
            tps += [TopicPartition(topic, p) for p in sorted(parts)]
        if not tps:
            return {}, {}
        consumer.assign(tps)
        starts: dict[TopicPartition, int] = await consumer.beginning_offsets(tps)
        for tp in tps:
            consumer.seek(tp, starts[tp])
        highs: dict[TopicPartition, int] = {}
        async with asyncio.timeout(timeout):
            while len(highs) < len(tps):
                await consumer.getmany(*tps, timeout_ms=100, max_records=1)
                for tp in tps:
                    hw = consumer.highwater(tp)
                    if hw is not None:
                        highs[tp] = hw
        return starts, highs
    except KAFKA_FAILURES as exc:  # TimeoutError included: no high-water mark in time
        raise translate(exc, "reading high-water marks") from exc
    finally:
        await consumer.stop()


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    parts = consumer.partitions_for_topic(topic)
    if not parts:
        await consumer._client.force_metadata_update()  # noqa: SLF001 - no public refresh
        parts = consumer.partitions_for_topic(topic)
    if not parts:
        raise InvalidRequest(f"unknown topic {topic!r}", field="topics")
    return set(parts)


def _since(now: float, known: float | None, metadata: str | None) -> float | None:
    """Seconds since the group's last commit: the caller's record, else the time our
    consumers write into each commit's metadata, else unknown."""
    at = known if known is not None else commit_time(metadata)
    return None if at is None else max(0.0, now - at)


def _gap(
    coverage: Mapping[PartitionKey, Ranges] | None,
    key: PartitionKey,
    committed: int | None,
    starts: Mapping[TopicPartition, int],
) -> int | None:
    if committed is None:
        return 0 if coverage is not None else None  # never committed: all of it is lag
    if coverage is None or key not in coverage:
        return None
    start = starts.get(TopicPartition(key[1], key[2]), 0)
    return holes(coverage[key], start, committed)


async def consumer_lag(
    bootstrap: str,
    groups: Mapping[str, Sequence[str]],
    *,
    last_commit: Mapping[str, float | None] | None = None,
    timeout: float = 10.0,
    coverage: Mapping[PartitionKey, Ranges] | None = None,
    load_coverage: CoverageLoader | None = None,
) -> list[LagRow]:
    """Lag of each group (``{group_id: [topic, ...]}``) on every partition of its topics.

    Rows are ordered by group, topic, partition. ``last_commit`` optionally gives each
    group's last commit time (unix seconds) to fill ``since_commit_s``; ``coverage`` (what
    each group applied, from ``CoverageStore.load_groups``) fills ``gap``.

    ``load_coverage`` is the right way to pass coverage for a running system: it is called
    *after* the committed offsets are read. A processor writes its ranges before it commits,
    so coverage read later always reaches the offsets read earlier; read before, a processor
    that commits in between shows a false gap (seen while a rebuilt broker was re-applied).
    """
    all_topics = [t for ts in groups.values() for t in ts]
    starts, highs = await end_offsets(bootstrap, all_topics, timeout=timeout)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_hosts(bootstrap))
    now = time.time()
    read: list[tuple[str, TopicPartition, OffsetAndMetadata | None]] = []
    try:
        await admin.start()
        for group in sorted(groups):
            tps = [tp for tp in highs if tp.topic in set(groups[group])]
            tps.sort(key=lambda tp: (tp.topic, tp.partition))
            offsets = await admin.list_consumer_group_offsets(group, partitions=tps)
            read.extend((group, tp, offsets.get(tp)) for tp in tps)
    except KAFKA_FAILURES as exc:
        raise translate(exc, "reading committed offsets") from exc
    finally:
        await admin.close()
    if load_coverage is not None:
        coverage = await load_coverage()
    rows: list[LagRow] = []
    for group, tp, om in read:
        committed = om.offset if om is not None and om.offset >= 0 else None
        end = highs[tp]
        base = committed if committed is not None else starts.get(tp, 0)
        lc = (last_commit or {}).get(group)
        rows.append(
            LagRow(
                group=group,
                topic=tp.topic,
                partition=tp.partition,
                committed=committed,
                end_offset=end,
                lag=max(0, end - base),
                since_commit_s=_since(now, lc, om.metadata if om is not None else None),
                gap=_gap(coverage, (group, tp.topic, tp.partition), committed, starts),
            )
        )
    return rows


async def topic_records(bootstrap: str, topic: str, *, timeout: float = 10.0) -> int | None:
    """How many records ``topic`` holds now (sum of its high-water marks; 0 when it does not
    exist); None when the broker cannot tell."""
    from memstream.errors import InfraError

    try:
        _, highs = await end_offsets(bootstrap, [topic], timeout=timeout)
    except InvalidRequest:
        return 0  # no such topic
    except InfraError:
        return None
    return sum(highs.values())


def max_gap(rows: Iterable[LagRow]) -> int:
    """The largest known gap among ``rows`` (0 for none)."""
    return max((r.gap for r in rows if r.gap is not None), default=0)


def max_lag(rows: Iterable[LagRow]) -> int:
    """The largest lag among ``rows`` (0 for none): ``memstream lag --max-lag`` compares it."""
    return max((r.lag for r in rows), default=0)


class LagWatcher:
    """Repeated :func:`consumer_lag` calls that remember when each group's offsets moved.

    ``since_commit_s`` of a group is the time since any of its committed offsets last changed,
    as seen by this watcher (None until a change has been seen, unless ``last_commit`` says).
    """

    def __init__(self, bootstrap: str, groups: Mapping[str, Sequence[str]]) -> None:
        self.bootstrap = bootstrap
        self.groups = {g: list(ts) for g, ts in groups.items()}
        self._seen: dict[tuple[str, str, int], int | None] = {}
        self._moved: dict[str, float] = {}

    async def poll(
        self,
        *,
        last_commit: Mapping[str, float | None] | None = None,
        coverage: Mapping[PartitionKey, Ranges] | None = None,
        load_coverage: CoverageLoader | None = None,
    ) -> list[LagRow]:
        known = dict(self._moved)
        known.update({g: t for g, t in (last_commit or {}).items() if t is not None})
        rows = await consumer_lag(
            self.bootstrap,
            self.groups,
            last_commit=known,
            coverage=coverage,
            load_coverage=load_coverage,
        )
        now = time.time()
        changed = False
        for r in rows:
            k = (r.group, r.topic, r.partition)
            if k in self._seen and self._seen[k] != r.committed:
                self._moved[r.group] = now
                changed = True
            self._seen[k] = r.committed
        if not changed:
            return rows
        return [
            LagRow(
                r.group,
                r.topic,
                r.partition,
                r.committed,
                r.end_offset,
                r.lag,
                now - self._moved[r.group] if r.group in self._moved else r.since_commit_s,
                r.gap,
            )
            for r in rows
        ]
