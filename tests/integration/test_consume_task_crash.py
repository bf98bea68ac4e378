"""A processor's consume task dying mid-batch (issue 12, "a processor crash at a random
point", the in-process form): the handler applied its batch (the sink write) and the task
ended before the offsets were committed. The consumer starts its loop again, sought back to
what it had handled, so the batch is handed over again (at-least-once) and every later
record is handled; before, the loop stayed dead (state "stopped") and the partition's
records after the crash were never handled by this process."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

import pytest

from memstream.infra.kafka.admin import ensure_topics
from memstream.infra.metrics import make_metrics
from memstream.infra.settings import Settings
from memstream.infra.supervisor import LoopStates
from memstream.schemas.events import Envelope, encode, thread_event
from memstream.schemas.topics import JOURNAL, Topics
from memstream.streams.processor import Processor, Received
from memstream.streams.runner import Runner
from tests.kafka_helpers import produce

pytestmark = pytest.mark.asyncio(loop_scope="session")


class CrashingOnce(Processor):
    """Applies each batch (records its ids), then, once, lets its task die before the
    consumer marks the batch handled: as a crash between the sink write and the commit."""

    name = "crashy"
    topic = JOURNAL
    batch_max = 5
    batch_within_s = 0.1

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.crashed = False

    async def handle_batch(self, items: Sequence[Received]) -> None:
        self.seen.extend(it.envelope.id for it in items)  # the sink write
        if not self.crashed and len(self.seen) >= 7:
            self.crashed = True
            raise asyncio.CancelledError  # the task dies here, nothing committed


def event() -> Envelope:
    return thread_event(
        "thread.created", "acct", "agent", "t", ts=1, data={}, event_id=uuid.uuid4().hex
    )


async def test_a_consume_task_that_dies_mid_batch_is_started_again_from_what_it_handled(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:10]}.")
    await ensure_topics(kafka_bootstrap, topics, 1, 1)
    settings = Settings(
        kafka_bootstrap=kafka_bootstrap,
        topic_prefix=topics.prefix,
        partitions=1,
        data_dir=tmp_path_factory.mktemp("crash"),
    )
    events = [event() for _ in range(30)]
    await produce(kafka_bootstrap, topics.journal, [("t", encode(e)) for e in events])
    proc = CrashingOnce()
    loops = LoopStates()
    runner = Runner(
        settings, {"crashy": lambda: proc}, make_metrics(), lag_interval_s=None, loops=loops
    )
    await runner.start()
    try:
        want = {e.id for e in events}
        try:
            async with asyncio.timeout(60):
                while not want <= set(proc.seen):
                    await asyncio.sleep(0.05)
        except TimeoutError:
            state = loops.get("processor:crashy")
            raise AssertionError(
                f"{len(want - set(proc.seen))} of {len(want)} records never handled after "
                f"the crash (loop state {state.state!r})"
            ) from None
        assert proc.crashed
        async with asyncio.timeout(30):
            while loops.get("processor:crashy").state != "running":
                await asyncio.sleep(0.05)
    finally:
        await runner.stop()
    # the crashed batch came again (its offsets were never committed); nothing was skipped,
    # and the log order of first sightings is the topic's order
    first = list(dict.fromkeys(proc.seen))
    assert first == [e.id for e in events]
    assert len(proc.seen) > len(events)
