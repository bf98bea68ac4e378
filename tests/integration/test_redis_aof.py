"""Valkey's append-only file rewritten for an erasure (``infra/redis_aof.py``), on a real
Valkey: a deleted key's write leaves the file; two erasures asking at once each get a
rewrite begun after their call; a server without an AOF is not asked."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from memstream.infra.embedded.redis import EmbeddedRedis
from memstream.infra.redis_aof import rewrite_append_log
from tests.fixtures.disk import settles_holding

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(loop_scope="session")
async def valkey(tmp_path: Path) -> AsyncIterator[tuple[EmbeddedRedis, aioredis.Redis]]:
    server = await EmbeddedRedis(tmp_path / "valkey").start()
    client = aioredis.from_url(server.url)
    yield server, client
    await client.aclose()
    await server.stop()


async def test_a_deleted_keys_write_leaves_the_file(
    valkey: tuple[EmbeddedRedis, aioredis.Redis],
) -> None:
    server, client = valkey
    await client.set("kept", "kept value")
    await client.set("gone", "the zqsummarycanary text")
    await client.delete("gone")
    assert await settles_holding(
        b"zqsummarycanary", server.data_dir, expect=True
    )  # the DEL appended after it
    assert await rewrite_append_log(client) is True
    assert not await settles_holding(b"zqsummarycanary", server.data_dir, expect=False)
    assert await client.get("kept") == b"kept value"


async def test_erasures_asking_at_once_each_get_a_rewrite_after_their_call(
    valkey: tuple[EmbeddedRedis, aioredis.Redis],
) -> None:
    _server, client = valkey
    before = int((await client.info("persistence"))["aof_rewrites"])
    assert list(await asyncio.gather(rewrite_append_log(client), rewrite_append_log(client))) == [
        True,
        True,
    ]
    assert int((await client.info("persistence"))["aof_rewrites"]) >= before + 2


async def test_a_server_without_an_aof_is_not_asked(
    valkey: tuple[EmbeddedRedis, aioredis.Redis],
) -> None:
    _server, client = valkey
    await client.config_set("appendonly", "no")
    before = int((await client.info("persistence"))["aof_rewrites"])
    assert await rewrite_append_log(client) is False
    assert int((await client.info("persistence"))["aof_rewrites"]) == before
