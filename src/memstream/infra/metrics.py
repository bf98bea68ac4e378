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
consumer_gaps_total                            counter    processor, kind (rewound, accepted,
                                                          store)
consumer_stalls_total                          counter    processor, remedy (seek, rebuild)
projection_gap                                 gauge      projection
dlq_events_total                               counter    processor, origin_topic
journal_append_seconds                         histogram  -
journal_group_commit_batch_size                histogram  -
relay_backlog                                  gauge      relay
erasures_total                                 counter    kind (thread, user), outcome (done,
                                                          failed: stays running, resumed)
erasure_step_seconds                           histogram  step (register, entries, keys,
                                                          threads)
recall_seconds                                 histogram  source (index, fallback)
context_assembly_seconds                       histogram  -
http_requests_total                            counter    method, route, status
http_request_seconds                           histogram  method, route
loop_state                                     gauge      loop, state (running, backoff,
                                                          waiting, stopped): 1 for the
                                                          current state, 0 for the others
loop_waiting                                   gauge      loop, dependency (only while
                                                          waiting)
loop_restarts_total                            counter    loop
server_up                                      gauge      server (1: running)
server_state                                   gauge      server, state (running,
                                                          restarting, failed, stopped)
server_restarts_total                          counter    server
ready                                          gauge      part (readiness: 1 ready)
process_* (cpu, memory, open fds, start time)  various    -  (prometheus' ProcessCollector)
=============================================  =========  ===================================

The ``loop_*``, ``server_*`` and ``ready`` series are read at scrape time from the sources
given to :meth:`Metrics.track_states` (the supervised loops' and the embedded servers'
snapshots, readiness): they always say what ``/readyz`` says.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
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
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["CONTENT_TYPE", "LOOP_STATES", "SERVER_STATES", "Metrics", "make_metrics"]

log = logging.getLogger(__name__)

#: ``{name: {"state": ..., "restarts": ..., ...}}`` (``LoopStates.snapshot``,
#: ``Keepers.snapshot``)
StateSnapshot = Callable[[], Mapping[str, Mapping[str, object]]]
#: ``{part: ready}`` (``Readiness.parts``)
PartsSnapshot = Callable[[], Mapping[str, bool]]

#: every state a supervised loop can be in (``infra.supervisor``)
LOOP_STATES: Final = ("running", "backoff", "waiting", "stopped")
#: every state of a kept embedded server (``infra.embedded.keeper``)
SERVER_STATES: Final = ("running", "restarting", "failed", "stopped")

CONTENT_TYPE: Final = CONTENT_TYPE_LATEST

# Sub-millisecond to tens of seconds: a Redis claim is ~0.2 ms, a summary with an LLM ~s.
_ERASURE_BUCKETS: Final = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
"""An erasure step: milliseconds for a thread, minutes for a large user's."""
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
            "the records in between, e.g. retention); store: the processor's own store held "
            "less than the committed offset (lost acknowledged writes) and the range was read "
            "again.",
            ["processor", "kind"],
            registry=r,
        )
        self.consumer_stalls = Counter(
            "memstream_consumer_stalls",
            "Times a processor's consumer stopped making progress with records behind it "
            "(see docs/streams.md, 'Stalls'), by remedy: seek (read again from what it "
            "handled) or rebuild (a new Kafka consumer).",
            ["processor", "remedy"],
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
        # --- erasure (agents_ctx.erasure) -------------------------------------------------------
        self.erasures = Counter(
            "memstream_erasures",
            "Erasure runs by kind and outcome (failed: the erasure stays running and is "
            "resumed at the next start).",
            ["kind", "outcome"],
            registry=r,
        )
        self.erasure_step_latency = Histogram(
            "memstream_erasure_step_seconds",
            "Time of each step of an erasure run: register (threads found, records flagged, "
            "the threads table rewritten), entries (memory entries, outbox), keys (data "
            "keys), threads (journal, summaries and Valkey, ClickHouse and its indexes).",
            ["step"],
            buckets=_ERASURE_BUCKETS,
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
        self._states = _StateCollector()
        r.register(self._states)

    def track_states(
        self,
        *,
        loops: StateSnapshot | None = None,
        servers: StateSnapshot | None = None,
        parts: PartsSnapshot | None = None,
    ) -> None:
        """Export the loops', the servers' and readiness's states (read at each scrape)."""
        if loops is not None:
            self._states.loops = loops
        if servers is not None:
            self._states.servers = servers
        if parts is not None:
            self._states.parts = parts

    def render(self) -> bytes:
        """The registry in Prometheus text format (serve with :data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """The current value of one sample (e.g. ``memstream_dlq_events_total``), or None."""
        return self.registry.get_sample_value(name, labels or {})


def make_metrics() -> Metrics:
    """A fresh registry with every memstream metric family (one per process)."""
    return Metrics()


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


class _StateCollector:
    """The ``loop_*``, ``server_*`` and ``ready`` families, built from snapshots at scrape
    time (a failing source drops its families from that scrape, never the scrape)."""

    def __init__(self) -> None:
        self.loops: StateSnapshot | None = None
        self.servers: StateSnapshot | None = None
        self.parts: PartsSnapshot | None = None

    def describe(self) -> list[Metric]:
        return []  # the families depend on the sources; none at registration

    def collect(self) -> Iterator[Metric]:
        builders: list[Callable[[], list[Metric]]] = []
        if (loops := self.loops) is not None:
            builders.append(lambda: _loop_families(loops()))
        if (servers := self.servers) is not None:
            builders.append(lambda: _server_families(servers()))
        if (parts := self.parts) is not None:
            builders.append(lambda: _ready_families(parts()))
        for build in builders:
            try:
                families = build()
            except Exception:  # noqa: BLE001 - a broken source never breaks /metrics
                log.warning("metrics: a state source failed", exc_info=True)
                continue
            yield from families


def _ready_families(parts: Mapping[str, bool]) -> list[Metric]:
    ready = GaugeMetricFamily("memstream_ready", "Readiness per part (1: ready).", labels=["part"])
    for part, ok in sorted(parts.items()):
        ready.add_metric([part], 1.0 if ok else 0.0)
    return [ready]


def _loop_families(snap: Mapping[str, Mapping[str, object]]) -> list[Metric]:
    state = GaugeMetricFamily(
        "memstream_loop_state",
        "Supervised loop state: 1 for the state it is in, 0 for the others.",
        labels=["loop", "state"],
    )
    waiting = GaugeMetricFamily(
        "memstream_loop_waiting",
        "A loop paused until a dependency is back (1 while it waits).",
        labels=["loop", "dependency"],
    )
    restarts = CounterMetricFamily(
        "memstream_loop_restarts",
        "Times a supervised loop failed and was started again (or backed off).",
        labels=["loop"],
    )
    for name, st in sorted(snap.items()):
        current = st.get("state")
        for s in LOOP_STATES:
            state.add_metric([name, s], 1.0 if current == s else 0.0)
        dep = st.get("waiting_for")
        if current == "waiting" and isinstance(dep, str):
            waiting.add_metric([name, dep], 1.0)
        restarts.add_metric([name], _number(st.get("restarts")))
    return [state, waiting, restarts]


def _server_families(snap: Mapping[str, Mapping[str, object]]) -> list[Metric]:
    up = GaugeMetricFamily(
        "memstream_server_up", "An embedded server is running (1) or not (0).", labels=["server"]
    )
    state = GaugeMetricFamily(
        "memstream_server_state",
        "Embedded server state: 1 for the state it is in, 0 for the others.",
        labels=["server", "state"],
    )
    restarts = CounterMetricFamily(
        "memstream_server_restarts",
        "Times an embedded server that died was started again.",
        labels=["server"],
    )
    for name, st in sorted(snap.items()):
        current = st.get("state")
        up.add_metric([name], 1.0 if current == "running" else 0.0)
        for s in SERVER_STATES:
            state.add_metric([name, s], 1.0 if current == s else 0.0)
        restarts.add_metric([name], _number(st.get("restarts")))
    return [up, state, restarts]
