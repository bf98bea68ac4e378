"""Host several processors in one asyncio loop.

``memstream up`` hosts every processor in its one process; ``memstream worker A B`` hosts the
chosen ones. Each processor gets its own consumer group and aiokafka consumer
(:class:`~memstream.streams.consumer.ProcessorConsumer`), so its lag, replay and scaling stay
its own; their poll loops run side by side as tasks of the current loop. Output and
dead-letter records of every hosted processor go through one shared producer (``acks=all``).

The composition root owns the mapping from processor names to factories and passes it in
(``Runner(settings, {"counters": make_counters, ...}, metrics)``): there is no global
registry. A factory is a zero-argument callable returning a fresh
:class:`~memstream.streams.processor.Processor`; it closes over the adapters it needs.

Guarantees:

- ``start()`` starts each processor (``Processor.start``) before its consumer, so no record
  is handed over before the processor is ready; if one fails to start, those already started
  are stopped and the error propagates.
- ``stop()`` stops consumers in reverse order: each finishes the batch in hand, commits the
  offsets it handled and leaves its group; then ``Processor.stop`` runs. Records not yet
  handled are re-delivered to the next member of the group (at-least-once).
- ``run_until_stopped()`` returns after SIGINT/SIGTERM (or ``request_stop()``, or
  cancellation), always having called ``stop()``.
- While running, consumer lag of every hosted group is refreshed into the
  ``memstream_consumer_lag`` gauge every ``lag_interval_s`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from memstream.errors import InvalidRequest, RetryableInfraError
from memstream.infra.data_keys import Keyring
from memstream.infra.metrics import Metrics
from memstream.infra.settings import Settings
from memstream.infra.supervisor import LoopStates
from memstream.streams.consumer import ProcessorConsumer
from memstream.streams.coverage import CoverageStore
from memstream.streams.lag import consumer_lag
from memstream.streams.processor import Processor, ProcessorContext, RetryPolicy

__all__ = ["HostedProcessor", "ProcessorFactory", "Runner"]

log = logging.getLogger(__name__)

ProcessorFactory = Callable[[], Processor]


@dataclass(slots=True)
class HostedProcessor:
    """One running processor: its consumer and the context it was started with."""

    name: str
    processor: Processor
    consumer: ProcessorConsumer

    @property
    def ctx(self) -> ProcessorContext:
        return self.consumer.ctx

    @property
    def group_id(self) -> str:
        return self.ctx.group_id

    @property
    def input_topic(self) -> str:
        return self.ctx.topics.prefix + self.processor.topic

    def assigned(self) -> bool:
        """True once the consumer holds at least one partition of the group."""
        return self.consumer.assigned()

    def last_commit(self) -> float | None:
        """Unix time of this processor's last commit in this process, or None."""
        return self.consumer.last_commit


class Runner:
    """Runs the selected processors, each its own consumer group, in the current loop."""

    def __init__(
        self,
        settings: Settings,
        factories: Mapping[str, ProcessorFactory],
        metrics: Metrics,
        *,
        names: Sequence[str] | None = None,
        bootstrap: str | None = None,
        retry: RetryPolicy | None = None,
        lag_interval_s: float | None = 5.0,
        keyring: Keyring | None = None,
        coverage: CoverageStore | None = None,
        loops: LoopStates | None = None,
    ) -> None:
        """``names`` selects processors (default: all, in ``factories`` order); an unknown
        name raises ``InvalidRequest(field="processors")``."""
        chosen = list(names) if names else list(factories)
        unknown = [n for n in chosen if n not in factories]
        if unknown:
            raise InvalidRequest(
                f"unknown processor(s) {', '.join(unknown)}; known: {', '.join(factories)}",
                field="processors",
            )
        if len(set(chosen)) != len(chosen):
            raise InvalidRequest("a processor is named twice", field="processors")
        self.settings = settings
        self.metrics = metrics
        self._factories = factories
        self._names = chosen
        self._bootstrap = bootstrap or settings.kafka_bootstrap
        self._retry = retry
        self._keyring = keyring
        self._lag_interval = lag_interval_s
        self._loops = loops
        self._coverage = coverage
        self._hosted: list[HostedProcessor] = []
        self._stop = asyncio.Event()
        self._lag_task: asyncio.Task[None] | None = None
        self._producer: AIOKafkaProducer | None = None

    @property
    def hosted(self) -> Sequence[HostedProcessor]:
        return tuple(self._hosted)

    def get(self, name: str) -> HostedProcessor:
        for h in self._hosted:
            if h.name == name:
                return h
        raise KeyError(name)

    async def start(self) -> None:
        try:
            if not self._bootstrap.strip():
                raise ValueError("kafka_bootstrap is empty: start the embedded broker or set it")
            self._producer = AIOKafkaProducer(
                bootstrap_servers=self._bootstrap,
                acks="all",
                linger_ms=2,
                metadata_max_age_ms=int(self.settings.kafka_metadata_max_age_s * 1000),
            )
            await self._producer.start()
            for name in self._names:
                processor = self._factories[name]()
                if processor.name != name:
                    raise InvalidRequest(
                        f"factory for {name!r} built processor named {processor.name!r}",
                        field="processors",
                    )
                consumer = ProcessorConsumer(
                    processor,
                    self.settings,
                    self.metrics,
                    bootstrap=self._bootstrap,
                    publish=self._publish,
                    retry=self._retry,
                    keyring=self._keyring,
                    coverage=self._coverage,
                    state=None if self._loops is None else self._loops.get(f"processor:{name}"),
                )
                await processor.start(consumer.ctx)
                self._hosted.append(HostedProcessor(name, processor, consumer))
            # Consumers join their groups concurrently: a join takes ~half a session timeout.
            await asyncio.gather(*(h.consumer.start() for h in self._hosted))
            for h in self._hosted:
                log.info("processor %s started (group %s)", h.name, h.group_id)
        except BaseException:
            await self.stop()
            raise
        if self._lag_interval:
            self._lag_task = asyncio.create_task(self._refresh_lag(self._lag_interval))

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until every hosted consumer holds partitions (raises TimeoutError)."""
        async with asyncio.timeout(timeout):
            while not all(h.assigned() for h in self._hosted):
                await asyncio.sleep(0.05)

    async def _publish(self, topic: str, key: bytes | None, value: bytes) -> None:
        """Send one record through the shared producer; acknowledged by the broker on return."""
        assert self._producer is not None, "Runner.start() was not called"
        try:
            await self._producer.send_and_wait(topic, value, key=key)
        except KafkaError as e:  # the broker is away: transient for the handler, retried
            raise RetryableInfraError(f"publishing to {topic} failed: {e}") from e

    async def stop(self) -> None:
        """Stop every hosted consumer, then its processor, then the producer. Idempotent."""
        if self._lag_task is not None:
            self._lag_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._lag_task
            self._lag_task = None
        while self._hosted:
            h = self._hosted.pop()
            try:
                await h.consumer.stop()
            except Exception:
                log.exception("processor %s: error while stopping its consumer", h.name)
            try:
                await h.processor.stop()
            except Exception:
                log.exception("processor %s: error in stop()", h.name)
            log.info("processor %s stopped", h.name)
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                await producer.stop()
            except Exception:
                log.exception("error while stopping the processors' producer")

    def request_stop(self) -> None:
        self._stop.set()

    async def run_until_stopped(self, *, handle_signals: bool = True) -> None:
        """Start, run until SIGINT/SIGTERM/``request_stop()``/cancellation, then stop."""
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        if handle_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.add_signal_handler(sig, self.request_stop)
                    installed.append(sig)
        try:
            await self.start()
            await self._stop.wait()
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            await asyncio.shield(self.stop())

    async def __aenter__(self) -> Runner:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _refresh_lag(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            hosted = list(self._hosted)
            if not hosted:
                continue
            try:
                # every hosted group in one read: one consumer and one admin client a
                # refresh, not two per processor (each bootstraps, looks up the broker's
                # API versions and reads metadata: ~2% of a busy loop, most of an idle one's
                # Kafka work, with the processors of ``memstream up``)
                groups: dict[str, list[str]] = {}
                for h in hosted:
                    groups.setdefault(h.group_id, []).append(h.input_topic)
                rows = await consumer_lag(
                    self._bootstrap,
                    groups,
                    last_commit={h.group_id: h.last_commit() for h in hosted},
                )
                for r in rows:
                    self.metrics.consumer_lag.labels(r.group, r.topic, str(r.partition)).set(r.lag)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("lag refresh failed: %s", e)
