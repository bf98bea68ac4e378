"""``SummaryStore.stored_many`` (the counters' lookup of the threads new to Redis) answers what
``get_stored`` answers, thread by thread and in order, on a local folder (listed one after
another) and on an in-memory obstore store (listed on a pool, as a remote store is): new
threads and summarized ones (their newest version); a listing that fails is a retryable
error naming the thread."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import obstore
import pytest
import redis.asyncio as aioredis
from obstore.store import LocalStore, MemoryStore

from memstream.errors import RetryableInfraError
from memstream.infra.summary_store import SummaryStore, thread_folder
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
    # the thread has a folder, so the local check does not answer for it: the listing does
    (tmp_path / thread_folder(ThreadRef("acc", "ag", "t1"))).mkdir(parents=True)

    def broken(*_: object, **__: object) -> object:
        raise OSError("the disk went away")

    monkeypatch.setattr("obstore.list_with_delimiter", broken)
    with pytest.raises(RetryableInfraError, match="acc/ag/t1"):
        await store.stored_many([ThreadRef("acc", "ag", "t1")])


async def test_erase_keys_deletes_every_key_of_the_threads_and_no_other(
    tmp_path: Path, redis_client: aioredis.Redis
) -> None:
    """One pass over the keyspace for every thread of an erasure: each key of theirs goes,
    whatever its name (offsets and spans in it) and whatever characters their ids hold
    (a glob's, the tag's own ``}:``), and nothing of another thread whose id they prefix."""
    store = SummaryStore(LocalStore(prefix=tmp_path, mkdir=True), redis_client)
    erased = [ThreadRef("acc", "ag", t) for t in ("t1", "a}:b", "x*[?]", "ünï")]
    kept = [ThreadRef("acc", "ag", t) for t in ("t10", "a}", "x", "t1:")]
    names = ["summary", "sumlock", "counters", "counters.g2", "counted:7", "flushed:0-9"]
    for ref in erased + kept:
        for name in names:
            await redis_client.set(f"ms:{{{ref.key}}}:{name}", "v")
    await redis_client.set("ms:stream:memstream-counters:next", "v")
    assert await store.erase_keys(erased) == len(erased) * len(names)
    for ref in erased:
        assert await redis_client.exists(*(f"ms:{{{ref.key}}}:{n}" for n in names)) == 0
    for ref in kept:
        assert await redis_client.exists(*(f"ms:{{{ref.key}}}:{n}" for n in names)) == len(names)
    assert await redis_client.exists("ms:stream:memstream-counters:next") == 1
    assert await store.erase_keys(erased) == 0  # idempotent


async def test_a_local_folder_answers_new_threads_without_a_listing_and_finds_every_id(
    tmp_path: Path, redis_client: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a local folder a thread with no folder is answered by the file system; a thread
    whose id needs quoting or hashing as a path segment is still found (its folder is the
    segment as obstore writes it)."""
    store = SummaryStore(LocalStore(prefix=tmp_path, mkdir=True), redis_client)
    odd = ["a b", "t/1", "ünï", "50%", ".hidden", "~tilde", "x" * 300, "ok-1_2.3~"]
    summarized = [ThreadRef(f"acc {i}", "ag/1", t) for i, t in enumerate(odd)]
    new = [ThreadRef(f"acc {i}", "ag/1", t + "-new") for i, t in enumerate(odd)]
    for ref in summarized:
        await store.write(ref, summary(1, 9), 0)
    listings: list[str] = []
    real = obstore.list_with_delimiter

    def counted(objects: LocalStore, prefix: str) -> object:
        listings.append(prefix)
        return real(objects, prefix)

    monkeypatch.setattr(obstore, "list_with_delimiter", counted)
    got = await store.stored_many(summarized + new)
    assert [s.version if s else None for s in got] == [1] * len(odd) + [None] * len(odd)
    assert len(listings) == len(odd)  # the summarized ones only: no listing for a new thread
