"""Topic provisioning and offset inspection on any Kafka-protocol broker.

* :func:`ensure_topics` creates memstream's topics (``journal``, ``memory``, ``summaries``,
  ``dlq``) if missing, with configs suited to replay: records are kept forever
  (``retention.ms=-1``, ``retention.bytes=-1``) so any projection can be rebuilt from offset 0.
  Idempotent: existing topics are left as they are (a differing partition count is logged, not
  changed), and a concurrent creator racing us is not an error.
* :func:`high_watermarks` gives the true end offset of every partition of a topic, from the
  high-water mark a Fetch returns — not from ``ListOffsets``, which Tansu answers wrongly when
  one record batch holds several records (INFRA.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from aiokafka import AIOKafkaClient, AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from memstream.errors import PermanentInfraError
from memstream.infra.kafka.failures import KAFKA_FAILURES, translate
from memstream.schemas.topics import Topics

__all__ = [
    "REPLAY_CONFIGS",
    "ensure_topics",
    "high_watermarks",
    "topic_configs",
    "topic_partitions",
]

log = logging.getLogger(__name__)

#: every memstream topic is a replayable log: keep everything, delete nothing by age or size
REPLAY_CONFIGS: Mapping[str, str] = {
    "retention.ms": "-1",
    "retention.bytes": "-1",
    "cleanup.policy": "delete",
}

_TOPIC_ALREADY_EXISTS = 36


def topic_configs(topics: Topics) -> dict[str, dict[str, str]]:
    """The config of each memstream topic, by full name."""
    return {name: dict(REPLAY_CONFIGS) for name in topics.all()}


async def ensure_topics(
    bootstrap: str,
    topics: Topics,
    partitions: int,
    replication: int,
    *,
    timeout: float = 30.0,
) -> list[str]:
    """Create the missing memstream topics; return the names created by this call.

    Raises PermanentInfraError when the broker refuses a topic (e.g. replication larger
    than the cluster), RetryableInfraError when it cannot be reached.
    """
    if partitions < 1:
        raise PermanentInfraError(f"partitions must be >= 1, got {partitions}")
    if replication < 1:
        raise PermanentInfraError(f"replication must be >= 1, got {replication}")
    wanted = topic_configs(topics)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout * 1000))
    try:
        await asyncio.wait_for(admin.start(), timeout)
        existing = await _describe_partitions(admin, list(wanted))
        for name, count in existing.items():
            if count != partitions:
                log.warning(
                    "topic %s exists with %d partitions (settings say %d); left unchanged",
                    name,
                    count,
                    partitions,
                )
        missing = [n for n in wanted if n not in existing]
        if not missing:
            return []
        response = await admin.create_topics(
            [NewTopic(n, partitions, replication, topic_configs=wanted[n]) for n in missing],
            timeout_ms=int(timeout * 1000),
        )
    except KAFKA_FAILURES as exc:
        raise translate(exc, f"creating topics {', '.join(wanted)}") from exc
    finally:
        await _quietly(admin.close())
    created: list[str] = []
    for row in response.topic_errors:
        name, code = row[0], row[1]
        if code == 0:
            created.append(name)
        elif code != _TOPIC_ALREADY_EXISTS:
            message = row[2] if len(row) > 2 else ""
            raise PermanentInfraError(f"kafka refused topic {name}: error {code} {message}")
    if created:
        await _wait_for_leaders(bootstrap, created, timeout)
        log.info(
            "created topics %s (%d partitions, replication %d)", created, partitions, replication
        )
    return created


async def _wait_for_leaders(bootstrap: str, names: list[str], timeout: float) -> None:
    """Wait until every partition of ``names`` has a leader (a fresh topic briefly has none,
    and producing to it then fails with NotLeaderForPartition)."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout * 1000))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        await asyncio.wait_for(client.bootstrap(), timeout)
        while True:
            cluster = await asyncio.wait_for(client.fetch_all_metadata(), timeout)
            if all(_has_leaders(cluster, n) for n in names):
                return
            if loop.time() > deadline:
                log.warning("topics %s still have partitions without a leader", names)
                return
            await asyncio.sleep(0.05)
    except KAFKA_FAILURES as exc:
        raise translate(exc, f"waiting for leaders of {', '.join(names)}") from exc
    finally:
        await _quietly(client.close())


def _has_leaders(cluster: Any, topic: str) -> bool:
    parts = cluster.partitions_for_topic(topic)
    if not parts:
        return False
    return all((cluster.leader_for_partition(TopicPartition(topic, p)) or -1) >= 0 for p in parts)


async def _describe_partitions(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, int]:
    """Partition count of each of ``names`` that exists.

    Asks for *all* topics: a Metadata request naming topics makes a broker with
    ``auto.create.topics.enable`` create them (with its default partition count).
    """
    wanted = set(names)
    out: dict[str, int] = {}
    for t in await admin.describe_topics(None):
        if t["topic"] in wanted and t.get("error_code", 0) == 0 and t.get("partitions"):
            out[t["topic"]] = len(t["partitions"])
    return out


async def high_watermarks(bootstrap: str, topic: str, *, timeout: float = 10.0) -> dict[int, int]:
    """The end offset (offset of the next record) of each partition of ``topic``.

    Read from the high-water mark of a Fetch response, which every broker reports correctly,
    starting the fetch one record before the ``ListOffsets`` answer so the fetch is cheap.
    """
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        request_timeout_ms=int(timeout * 1000),
        fetch_max_wait_ms=100,
    )
    try:
        await asyncio.wait_for(consumer.start(), timeout)
        parts = await topic_partitions(bootstrap, topic, timeout)
        tps = [TopicPartition(topic, p) for p in parts]
        consumer.assign(tps)
        listed = await consumer.end_offsets(tps)
        for tp in tps:
            consumer.seek(tp, max(0, listed[tp] - 1))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        out: dict[int, int] = {}
        while True:
            for tp in tps:
                hw = consumer.highwater(tp)
                if hw is not None:
                    out[tp.partition] = hw
            if len(out) == len(tps):
                return out
            if loop.time() > deadline:
                missing = sorted(set(parts) - set(out))
                raise translate(
                    TimeoutError(f"no high-water mark for partitions {missing}"),
                    f"reading end offsets of {topic}",
                )
            # records fetched are discarded: only the high-water marks are wanted
            await consumer.getmany(timeout_ms=100, max_records=1000)
    except KAFKA_FAILURES as exc:
        raise translate(exc, f"reading end offsets of {topic}") from exc
    finally:
        await _quietly(consumer.stop())


async def topic_partitions(bootstrap: str, topic: str, timeout: float = 10.0) -> list[int]:
    """Partition ids of ``topic`` (all-topics metadata: never auto-creates it)."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout * 1000))
    try:
        await asyncio.wait_for(client.bootstrap(), timeout)
        cluster = await asyncio.wait_for(client.fetch_all_metadata(), timeout)
    finally:
        await _quietly(client.close())
    parts = cluster.partitions_for_topic(topic)
    if not parts:
        raise PermanentInfraError(f"kafka: topic {topic} does not exist")
    return sorted(parts)


async def _quietly(aw: object) -> None:
    try:
        await asyncio.wait_for(aw, 10.0)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - closing a client must not hide the real error
        log.debug("closing a kafka client failed", exc_info=True)
