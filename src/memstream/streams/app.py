"""The faust app factory: one faust App (and one consumer group) per processor.

- :func:`make_app` builds a bare faust App tuned for this project: web server off, no
  leader topic, memory table store, ``earliest`` offset reset, quick group joins
  (``broker_session_timeout`` / ``broker_heartbeat_interval`` from settings: with faust's
  60 s default a join on Tansu takes ~30 s, with 6 s ~5 s), commits every second.
- :func:`attach_processor` subscribes a :class:`~memstream.streams.processor.Processor` to
  its topic as the App's single agent (concurrency 1, so records of one partition are handled
  in order) and routes every record through a :class:`Dispatcher`.
- :func:`group_id` is the consumer group of a processor: ``<prefix>-<name>`` where
  ``<prefix>`` is the topic prefix without its trailing separator (``memstream-counters``).

Commits. faust acknowledges a record once the agent asks for the next one (or, for a batch
from ``take_events``, once the agent body returns for that batch); acknowledged offsets are
committed every ``broker_commit_interval`` seconds and on a clean stop. The dispatcher
returns only after the handler succeeded (for a batching processor: after its flush) or the
record is in the dead-letter topic, so **an offset is never committed before its effect is
durable**. A crash between effect and commit re-delivers the record: at-least-once.

No module-level state: every App, topic and agent is built inside these functions.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import faust
from faust.sensors import Sensor
from faust.types import EventT, StreamT

from memstream.infra.metrics import Metrics
from memstream.infra.settings import Settings
from memstream.schemas.topics import Topics
from memstream.streams.processor import (
    Dispatcher,
    EventMeta,
    Processor,
    ProcessorContext,
    RawRecord,
    RetryPolicy,
)

__all__ = ["attach_processor", "broker_urls", "group_id", "make_app"]

#: How often acknowledged offsets are committed (seconds). faust's default is 2.8 s.
COMMIT_INTERVAL_S = 1.0


def group_id(settings: Settings, name: str) -> str:
    """Consumer group of processor ``name``: ``memstream-<name>`` with the default prefix."""
    prefix = settings.topic_prefix.rstrip(".-_") or "memstream"
    return f"{prefix}-{name}"


def broker_urls(bootstrap: str) -> list[str]:
    """``"h1:9092,h2:9092"`` -> ``["kafka://h1:9092", "kafka://h2:9092"]``."""
    hosts = [h.strip() for h in bootstrap.split(",") if h.strip()]
    if not hosts:
        raise ValueError("kafka_bootstrap is empty: start the embedded broker or set it")
    return [h if "://" in h else f"kafka://{h}" for h in hosts]


def make_app(
    name: str,
    settings: Settings,
    *,
    bootstrap: str | None = None,
    datadir: Path | None = None,
    **overrides: Any,
) -> faust.App:
    """A faust App for processor ``name``: its own consumer group, no web server.

    ``bootstrap`` overrides ``settings.kafka_bootstrap`` (the embedded launcher knows the
    address only at run time); ``datadir`` defaults to ``<data_dir>/faust/<group>``;
    ``overrides`` go straight to ``faust.App`` (e.g. ``broker_commit_interval``).
    """
    gid = group_id(settings, name)
    folder = datadir or settings.resolved_data_dir() / "faust" / gid
    folder.parent.mkdir(parents=True, exist_ok=True)  # faust creates only the last level
    conf: dict[str, Any] = {
        "broker": broker_urls(bootstrap or settings.kafka_bootstrap),
        "autodiscover": False,
        "datadir": str(folder),
        "web_enabled": False,
        "topic_disable_leader": True,
        "topic_partitions": settings.partitions,
        "topic_replication_factor": settings.replication_factor,
        "store": "memory://",
        "processing_guarantee": "at_least_once",
        "consumer_auto_offset_reset": "earliest",
        "broker_session_timeout": settings.consumer_session_timeout_s,
        "broker_heartbeat_interval": settings.consumer_heartbeat_interval_s,
        "broker_rebalance_timeout": max(settings.consumer_session_timeout_s * 2, 10.0),
        "broker_commit_interval": COMMIT_INTERVAL_S,
        "stream_wait_empty": True,
        "producer_acks": -1,
        "broker_max_poll_records": 1000,
    }
    conf.update(overrides)
    return faust.App(gid, **conf)


class _CommitSensor(Sensor):
    """Records the time of each completed commit (metric + ``last_commit`` attribute)."""

    def __init__(self, processor: str, metrics: Metrics) -> None:
        super().__init__()
        self.last_commit: float | None = None
        self._gauge = metrics.last_commit.labels(processor)

    def on_commit_completed(self, consumer: Any, state: Any) -> None:
        self.last_commit = time.time()
        self._gauge.set(self.last_commit)


def _raw(event: EventT[bytes]) -> RawRecord:
    msg = event.message
    value = msg.value
    key = msg.key
    return RawRecord(
        meta=EventMeta(
            topic=msg.topic,
            partition=msg.partition,
            offset=msg.offset,
            key=key if isinstance(key, bytes) or key is None else str(key).encode(),
            timestamp=msg.timestamp,
        ),
        value=value if isinstance(value, bytes) else b"" if value is None else str(value).encode(),
    )


def attach_processor(
    app: faust.App,
    processor: Processor,
    settings: Settings,
    metrics: Metrics,
    *,
    retry: RetryPolicy | None = None,
) -> ProcessorContext:
    """Subscribe ``processor`` to its input topic as ``app``'s agent.

    Returns the :class:`ProcessorContext` the runner passes to ``processor.start``. Output
    and dead-letter records go through the App's own producer and are acknowledged by the
    broker before the input record is acknowledged.
    """
    topics = Topics(settings.topic_prefix)
    source = app.topic(
        topics.prefix + processor.topic,
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        allow_empty=True,
    )

    async def publish(topic: str, key: bytes | None, value: bytes) -> None:
        await app.producer.send_and_wait(topic, key, value, None, None, None)

    dispatcher = Dispatcher(
        processor, dlq_topic=topics.dlq, publish=publish, metrics=metrics, retry=retry
    )
    sensor = _CommitSensor(processor.name, metrics)
    app.sensors.add(sensor)

    async def agent(stream: StreamT[bytes]) -> None:
        if processor.batch_max > 1:
            # take_events is on faust's Stream but missing from its StreamT interface.
            batches = stream.take_events(  # type: ignore[attr-defined]
                processor.batch_max, within=processor.batch_within_s
            )
            async for events in batches:
                await dispatcher.dispatch([_raw(e) for e in events])
        else:
            async for event in stream.events():
                await dispatcher.dispatch([_raw(event)])

    app.agent(source, name=f"{processor.name}-agent", concurrency=1)(agent)
    return ProcessorContext(
        name=processor.name,
        group_id=str(app.conf.id),
        settings=settings,
        topics=topics,
        metrics=metrics,
        publish_raw=publish,
    )


def commit_sensor(app: faust.App) -> Sequence[Any]:
    """The commit sensors attached to ``app`` (used by the runner to read last-commit times)."""
    return [s for s in app.sensors if isinstance(s, _CommitSensor)]


def last_commit_time(app: faust.App) -> float | None:
    """Unix time of ``app``'s last completed commit in this process, or None."""
    times = [s.last_commit for s in commit_sensor(app) if s.last_commit is not None]
    return max(times) if times else None
