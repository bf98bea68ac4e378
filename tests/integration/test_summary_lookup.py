"""``SummaryStore.stored_many`` (the counters' lookup of the threads new to Redis) answers what
``get_stored`` answers, thread by thread and in order, on a local folder (listed one after
another) and on an in-memory obstore store (listed on a pool, as a remote store is): new
threads and summarized ones (their newest version); a listing that fails is a retryable
error naming the thread."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from obstore.store import LocalStore, MemoryStore

from memstream.errors import RetryableInfraError
from memstream.infra.summary_store import SummaryStore
from memstream.schemas.records import Summary, ThreadRef


def summary(version: int, last: int) -> Summary:
    return Summary(
        version=version,
        timestamp=datetime(2026, 12, 6, tzinfo=UTC),
        last_message_offset=last,
        last_message_id=f"m{last}",
        content=f"summary {version}",
        token_count=3,
        message_count=last + 1,
    )


@pytest.mark.parametrize("kind", ["local", "memory"])
async def test_stored_many_answers_as_get_stored(
    kind: str, tmp_path: Path, redis_client: aioredis.Redis
) -> None:
    objects = LocalStore(prefix=tmp_path, mkdir=True) if kind == "local" else MemoryStore()
    store = SummaryStore(objects, redis_client)
    refs = [ThreadRef("acc", "ag", f"t{i}") for i in range(70)] + [
        ThreadRef("acc/x", "ag", "t/1"),  # ids that need quoting in a path
        ThreadRef("acc", "ag", "ünï"),
    ]
    for i, ref in enumerate(refs):
        if i % 3 == 0:
            await store.write(ref, summary(1, 9), 0)
            if i % 2 == 0:
                await store.write(ref, summary(2, 19), 1)
    got = await store.stored_many(refs)
    assert got == [await store.get_stored(r) for r in refs]
    assert [s.version if s else None for s in got] == [
        (2 if i % 2 == 0 else 1) if i % 3 == 0 else None for i in range(len(refs))
    ]
    assert await store.stored_many([]) == []


async def test_a_failed_listing_is_retryable(
    tmp_path: Path, redis_client: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SummaryStore(LocalStore(prefix=tmp_path, mkdir=True), redis_client)

    def broken(*_: object, **__: object) -> object:
        raise OSError("the disk went away")

    monkeypatch.setattr("obstore.list_with_delimiter", broken)
    with pytest.raises(RetryableInfraError, match="acc/ag/t1"):
        await store.stored_many([ThreadRef("acc", "ag", "t1")])
