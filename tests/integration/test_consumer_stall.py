"""A processor whose Kafka consumer stops making progress, with no error, reads on by itself
(``consumer_stall_s``; docs/streams.md, "Stalls").

Seen once in ~30 chaos runs: after a broker ``kill -9`` the message projector held its three
partitions at offsets 44/18/28 of 1060/375/677 for minutes, state ``running``, nothing in the
log. The faults are made here on the session's real broker, through the consumer's own
aiokafka client: a fetch position moved past records that nothing follows, a partition that
is never fetched (paused), a poll that never returns. What a user notices is asserted: every
record handled (none lost), in log order of first sighting, and no remedy when nothing is
wrong (an idle processor, one paused on a store's outage).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition

from memstream.errors import StoreUnavailable
from memstream.infra.kafka.admin import ensure_topics
from memstream.infra.metrics import Metrics, make_metrics
from memstream.infra.settings import Settings
from memstream.infra.supervisor import LoopStates
from memstream.schemas.events import Envelope, encode, thread_event
from memstream.schemas.topics import JOURNAL, Topics
from memstream.streams.consumer import ProcessorConsumer
from memstream.streams.lag import consumer_lag, max_lag
from memstream.streams.processor import Processor, Received
from memstream.streams.runner import Runner
from tests.kafka_helpers import produce

pytestmark = pytest.mark.asyncio(loop_scope="session")

STALL_S = 1.5


class Collect(Processor):
    """Records the ids it handled (in order, duplicates kept); down for ``down_s`` first."""

    name = "stalls"
    topic = JOURNAL
    batch_max = 50
    batch_within_s = 0.05

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.down_until = 0.0

    async def handle_batch(self, items: Sequence[Received]) -> None:
        if asyncio.get_running_loop().time() < self.down_until:
            raise StoreUnavailable("postgres is unavailable: connection refused")
        self.seen.extend(it.envelope.id for it in items)


def events(n: int) -> list[Envelope]:
    return [
        thread_event(
            "thread.created", "acct", "agent", "t", ts=1, data={}, event_id=uuid.uuid4().hex
        )
        for _ in range(n)
    ]


def stalls(metrics: Metrics, remedy: str) -> float:
    value = metrics.registry.get_sample_value(
        "memstream_consumer_stalls_total", {"processor": "stalls", "remedy": remedy}
    )
    return value or 0.0


class Rig:
    def __init__(self, bootstrap: str, data_dir: Path) -> None:
        self.bootstrap = bootstrap
        self.topics = Topics(prefix=f"t{uuid.uuid4().hex[:10]}.")
        self.settings = Settings(
            kafka_bootstrap=bootstrap,
            topic_prefix=self.topics.prefix,
            partitions=1,
            data_dir=data_dir,
            consumer_stall_s=STALL_S,
        )
        self.proc = Collect()
        self.metrics = make_metrics()
        self.loops = LoopStates()
        self.runner = Runner(
            self.settings,
            {"stalls": lambda: self.proc},
            self.metrics,
            lag_interval_s=None,
            loops=self.loops,
        )
        self.sent: list[Envelope] = []
        self.tp = TopicPartition(self.topics.journal, 0)

    @property
    def consumer(self) -> ProcessorConsumer:
        return self.runner.get("stalls").consumer

    @property
    def client(self) -> Any:  # the aiokafka consumer the processor polls with
        return self.consumer._consumer

    async def start(self) -> None:
        await ensure_topics(self.bootstrap, self.topics, 1, 1)
        await self.runner.start()

    async def send(self, n: int) -> None:
        batch = events(n)
        self.sent += batch
        await produce(self.bootstrap, self.topics.journal, [("t", encode(e)) for e in batch])

    async def all_handled(self, within: float, fault: str) -> None:
        want = {e.id for e in self.sent}
        try:
            async with asyncio.timeout(within):
                while not want <= set(self.proc.seen):
                    await asyncio.sleep(0.05)
        except TimeoutError:
            missing = len(want - set(self.proc.seen))
            state = self.loops.get("processor:stalls").describe()
            raise AssertionError(
                f"{fault}: {missing} of {len(want)} records never handled within {within:.0f}s "
                f"(loop state {state!r})"
            ) from None
        # nothing skipped: first sightings follow the topic's order
        assert list(dict.fromkeys(self.proc.seen)) == [e.id for e in self.sent]


@pytest.fixture
async def rig(kafka_bootstrap: str, tmp_path: Path) -> Any:
    r = Rig(kafka_bootstrap, tmp_path)
    await r.start()
    try:
        yield r
    finally:
        await r.runner.stop()


async def test_an_idle_caught_up_processor_is_not_a_stall(rig: Rig) -> None:
    await rig.send(10)
    await rig.all_handled(30, "first records")
    await asyncio.sleep(STALL_S * 3)
    assert stalls(rig.metrics, "seek") == stalls(rig.metrics, "rebuild") == 0


async def test_records_behind_a_position_moved_past_them_are_read_again(rig: Rig) -> None:
    await rig.send(10)
    await rig.all_handled(30, "first records")
    # records 10..19 arrive while the partition is not fetched, then the position jumps past
    # them: nothing follows, so no later poll shows a gap
    rig.client.pause(rig.tp)
    await rig.send(10)
    rig.client.seek(rig.tp, 20)
    rig.client.resume(rig.tp)
    await rig.all_handled(STALL_S * 10, "a position moved past 10 records")
    assert stalls(rig.metrics, "seek") >= 1
    assert stalls(rig.metrics, "rebuild") == 0


async def test_a_partition_never_fetched_gets_a_new_consumer(rig: Rig) -> None:
    await rig.send(10)
    await rig.all_handled(30, "first records")
    old = rig.client
    old.pause(rig.tp)  # as a partition the fetcher never starts: a seek does not help
    await rig.send(25)
    await rig.all_handled(STALL_S * 20, "a partition never fetched")
    assert stalls(rig.metrics, "seek") >= 1
    assert stalls(rig.metrics, "rebuild") >= 1
    assert rig.client is not old
    async with asyncio.timeout(30):
        while rig.loops.get("processor:stalls").state != "running":
            await asyncio.sleep(0.05)


async def test_a_poll_that_never_returns_gets_a_new_consumer(rig: Rig) -> None:
    await rig.send(10)
    await rig.all_handled(30, "first records")
    old = rig.client

    async def hangs(*args: object, **kwargs: object) -> object:
        await asyncio.Event().wait()  # as aiokafka waiting for an assignment that never comes
        raise AssertionError("unreachable")

    # the bound is max(stall_s, rebalance timeout + 10 s) = 22 s with the broker's minimal
    # session timeout; shortened here so the test does not wait for it
    rig.consumer._poll_stuck_s = STALL_S
    old.getmany = hangs
    await rig.send(10)
    await rig.all_handled(30, "a poll that never returns")
    assert stalls(rig.metrics, "rebuild") >= 1
    assert rig.client is not old


async def test_a_commit_that_never_returns_gets_a_new_consumer(rig: Rig) -> None:
    """As the chaos suite saw after a broker ``kill -9``: aiokafka's commit waiting for good
    on a coordinator lookup. The processor gets a new consumer, and what it handled is
    committed again, so its lag comes back to 0 instead of holding for good."""
    await rig.send(10)
    await rig.all_handled(30, "first records")
    old = rig.client

    async def hangs(*args: object, **kwargs: object) -> object:
        await asyncio.Event().wait()  # as a coordinator lookup that never ends
        raise AssertionError("unreachable")

    rig.consumer._poll_stuck_s = STALL_S  # the bound, shortened as for a poll above
    old.commit = hangs
    await rig.send(10)
    await rig.all_handled(30, "records behind a commit that never returns")
    async with asyncio.timeout(60):  # the rebuild replaces it once the old one is closed
        while rig.client is old:
            await asyncio.sleep(0.05)
    assert stalls(rig.metrics, "rebuild") >= 1
    async with asyncio.timeout(60):  # committed up to the end: lag 0 again, as read by ops
        while True:  # (not through the new client: it may not have started yet)
            rows = await consumer_lag(rig.bootstrap, {rig.consumer.group_id: [rig.topics.journal]})
            if [r.committed for r in rows] == [len(rig.sent)]:
                break
            await asyncio.sleep(0.1)
    assert max_lag(rows) == 0


async def test_a_processor_waiting_for_its_store_is_not_a_stall(rig: Rig) -> None:
    rig.proc.down_until = asyncio.get_running_loop().time() + STALL_S * 4
    await rig.send(10)
    async with asyncio.timeout(30):
        while rig.loops.get("processor:stalls").state != "waiting":
            await asyncio.sleep(0.05)
    await rig.all_handled(60, "records held by a store's outage")
    assert stalls(rig.metrics, "seek") == stalls(rig.metrics, "rebuild") == 0
