"""The one Prometheus registry of a memstream process, and every metric family in it.

A :class:`Metrics` object owns a fresh ``CollectorRegistry`` and binds every family to it.
The composition root builds exactly one (``make_metrics()``) per process and passes it to
whatever records or exposes metrics (stream runtime, journal writer, relays, memory tools,
context assembly, ``/metrics``). Nothing registers into prometheus_client's global default
registry, so tests can build as many independent ``Metrics`` as they like.

Names (all prefixed ``memstream_``):

=============================================  =========  ===================================
name                                           type       labels
=============================================  =========  ===================================
processor_events_total                         counter    processor, topic
processor_errors_total                         counter    processor, kind (decode, handler,
                                                          retry)
processor_latency_seconds                      histogram  processor
processor_last_commit_timestamp_seconds        gauge      processor
consumer_lag                                   gauge      group, topic, partition
consumer_gaps_total                            counter    processor, kind (rewound, accepted)
projection_gap                                 gauge      projection
dlq_events_total                               counter    processor, origin_topic
journal_append_seconds                         histogram  -
journal_group_commit_batch_size                histogram  -
relay_backlog                                  gauge      relay
recall_seconds                                 histogram  source (index, fallback)
context_assembly_seconds                       histogram  -
http_requests_total                            counter    method, route, status
http_request_seconds                           histogram  method, route
process_* (cpu, memory, open fds, start time)  various    -  (prometheus' ProcessCollector)
=============================================  =========  ===================================
"""

from __future__ import annotations

from typing import Final

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

__all__ = ["CONTENT_TYPE", "Metrics", "make_metrics"]

CONTENT_TYPE: Final = CONTENT_TYPE_LATEST

# Sub-millisecond to tens of seconds: a Redis claim is ~0.2 ms, a summary with an LLM ~s.
_LATENCY_BUCKETS: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
_BATCH_BUCKETS: Final = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class Metrics:
    """Every metric family of one process, bound to one registry (``self.registry``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        # --- stream processors ------------------------------------------------------------------
        self.events_processed = Counter(
            "memstream_processor_events",
            "Events a processor handled (applied or dead-lettered), per input topic.",
            ["processor", "topic"],
            registry=r,
        )
        self.processor_errors = Counter(
            "memstream_processor_errors",
            "Processor failures: decode (bad bytes), handler (exception), retry (a retryable "
            "infra error that was retried).",
            ["processor", "kind"],
            registry=r,
        )
        self.processing_latency = Histogram(
            "memstream_processor_latency_seconds",
            "Time to handle one event (or one batch, for batching processors).",
            ["processor"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.last_commit = Gauge(
            "memstream_processor_last_commit_timestamp_seconds",
            "Unix time of the processor's last completed offset commit.",
            ["processor"],
            registry=r,
        )
        self.consumer_lag = Gauge(
            "memstream_consumer_lag",
            "Records not yet committed by a consumer group (end offset - committed offset).",
            ["group", "topic", "partition"],
            registry=r,
        )
        self.consumer_gaps = Counter(
            "memstream_consumer_gaps",
            "Polls whose first record of a partition was past the next offset the processor "
            "expected: rewound (sought back and re-read) or accepted (the broker no longer has "
            "the records in between, e.g. retention).",
            ["processor", "kind"],
            registry=r,
        )
        self.projection_gap = Gauge(
            "memstream_projection_gap",
            "Records below a processor's committed offsets (on the partitions this process "
            "holds) that it never applied: a silently skipped range (see `memstream lag`, "
            "column gap). 0 when healthy; sum across processes.",
            ["projection"],
            registry=r,
        )
        self.dead_letters = Counter(
            "memstream_dlq_events",
            "Events sent to the dead-letter topic.",
            ["processor", "origin_topic"],
            registry=r,
        )
        self.shredded_records = Counter(
            "memstream_shredded_records",
            "Sealed records skipped because an erasure destroyed their data key.",
            ["processor"],
            registry=r,
        )
        # --- journal and relays -----------------------------------------------------------------
        self.journal_append_latency = Histogram(
            "memstream_journal_append_seconds",
            "Journal append latency, from call to durable.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.journal_batch_size = Histogram(
            "memstream_journal_group_commit_batch_size",
            "Records made durable by one group commit.",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.relay_backlog = Gauge(
            "memstream_relay_backlog",
            "Records written but not yet published by a relay.",
            ["relay"],
            registry=r,
        )
        # --- read side --------------------------------------------------------------------------
        self.recall_latency = Histogram(
            "memstream_recall_seconds",
            "memory_recall latency by answering source.",
            ["source"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.context_latency = Histogram(
            "memstream_context_assembly_seconds",
            "Context assembly latency.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

        # --- HTTP (agents_ctx.http.observe) ------------------------------------------------------
        self.http_requests = Counter(
            "memstream_http_requests",
            "HTTP requests answered, per route template and status.",
            ["method", "route", "status"],
            registry=r,
        )
        self.http_latency = Histogram(
            "memstream_http_request_seconds",
            "HTTP request latency (to the last byte sent), per route template.",
            ["method", "route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes...

    def render(self) -> bytes:
        """The registry in Prometheus text format (serve with :data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """The current value of one sample (e.g. ``memstream_dlq_events_total``), or None."""
        return self.registry.get_sample_value(name, labels or {})


def make_metrics() -> Metrics:
    """A fresh registry with every memstream metric family (one per process)."""
    return Metrics()
