"""The console's :class:`~memstream.agents_ctx.console.ports.Operations` over a running
:class:`Stack`: lag of every processor group (committed offsets from Kafka, last commits
from the runner hosted here), the relays' backlogs, and the dead-letter topic.

Retries made from the console are remembered in Redis (hash ``ms:console:dlq-retried``,
letter id -> unix time), so a retried letter leaves the "failing" list for every API
process; a newer dead letter of the same processor and payload marks it "failed again".
"""

from __future__ import annotations

import time
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

from memstream.agents_ctx.console.ports import LagPoint, Letter, RetryOutcome
from memstream.schemas.topics import JOURNAL, MEMORY, SUMMARIES, Topics

if TYPE_CHECKING:
    from memstream.infra.cli.wiring import Stack

#: every processor and the topic it consumes (as ``memstream lag`` reports them)
PROCESSOR_TOPICS: dict[str, str] = {
    "counters": JOURNAL,
    "summarizer": SUMMARIES,
    "message-projector": JOURNAL,
    "memory-projector": MEMORY,
}
RETRIED_KEY = "ms:console:dlq-retried"


class StackOperations:
    def __init__(self, stack: Stack) -> None:
        self._stack = stack

    def processors(self) -> Sequence[str]:
        return list(PROCESSOR_TOPICS)

    def _groups(self) -> dict[str, str]:
        from memstream.streams.consumer import group_id

        return {group_id(self._stack.settings, p): p for p in PROCESSOR_TOPICS}

    def last_commits(self) -> dict[str, float | None]:
        runner = self._stack.runner
        if runner is None:
            return {}
        return {h.name: h.last_commit() for h in runner.hosted}

    async def lag(self) -> list[LagPoint]:
        from memstream.streams.lag import consumer_lag, processor_groups

        s = self._stack.settings
        by_group = self._groups()
        rows = await consumer_lag(s.kafka_bootstrap, processor_groups(s, PROCESSOR_TOPICS))
        return [
            LagPoint(by_group[r.group], r.topic, r.partition, r.committed, r.end_offset, r.lag)
            for r in rows
        ]

    async def relay_backlog(self) -> dict[str, int]:
        from memstream.infra.cli.health_wiring import relay_backlogs

        out = relay_backlogs(self._stack)
        if self._stack.pool is not None:
            from memstream.agents_ctx.memory.outbox import unpublished_count

            out["memory"] = await unpublished_count(self._stack.pool)
        return out

    async def _retried(self) -> dict[str, float]:
        redis = self._stack.redis
        if redis is None:
            return {}
        raw = await redis.hgetall(RETRIED_KEY)
        return {(k.decode() if isinstance(k, bytes) else str(k)): float(v) for k, v in raw.items()}

    async def dead_letters(self, limit: int) -> list[Letter]:
        from memstream.streams.dlq import list_dead_letters

        s = self._stack.settings
        found = await list_dead_letters(s.kafka_bootstrap, Topics(s.topic_prefix), limit)
        retried = await self._retried()
        letters: list[Letter] = []
        for d in found:
            at = retried.get(d.id)
            again = None
            if at is not None:
                again = next(
                    (
                        e.id
                        for e in found
                        if e.ts > at * 1000
                        and e.processor == d.processor
                        and e.payload == d.payload
                    ),
                    None,
                )
            letters.append(
                Letter(
                    d.id,
                    d.ts,
                    d.processor,
                    d.error,
                    d.origin_topic,
                    d.origin_partition,
                    d.origin_offset,
                    d.key,
                    d.payload,
                    d.lossless,
                    at,
                    again,
                )
            )
        return letters

    async def retry(self, ids: Collection[str]) -> RetryOutcome:
        from memstream.streams.dlq import retry_dead_letters

        s = self._stack.settings
        report = await retry_dead_letters(s.kafka_bootstrap, Topics(s.topic_prefix), ids)
        done = [d.id for d in report.republished]
        # every found, lossless letter was re-published, itself or through another letter of
        # the same origin record (dead-lettered by several processors: re-published once)
        wanted = set(ids) - set(report.missing) - {d.id for d in report.skipped_lossy}
        if self._stack.redis is not None and wanted:
            now = time.time()
            await self._stack.redis.hset(RETRIED_KEY, mapping=dict.fromkeys(wanted, now))
        return RetryOutcome(done, [d.id for d in report.skipped_lossy], list(report.missing))
