"""Erasure end to end on ``memstream up`` (real Kafka, Postgres, Valkey, SlateDB, chdb,
qdrant-edge in one subprocess), driven as a user would: the ``memstream memory`` and
``memstream erase`` commands, then ``replay messages --from-journal``, ``replay messages``
(from the topic) and ``replay memory``; the erased user's content is nowhere afterwards,
and the other user's is all there."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
import httpx
import pytest

from memstream.infra.cli.state import read_state
from memstream.infra.data_keys import Keyring, is_sealed
from memstream.schemas.topics import Topics
from tests.integration.test_cli_up import KEY, cli, start_up, stop_up
from tests.kafka_helpers import read_topic

pytestmark = pytest.mark.asyncio(loop_scope="session")

SECRET = "marmalade-tortoise"
KEPT = "cardamom-heron"


async def eventually(check: Callable[[], Awaitable[bool]], what: str, seconds: float = 90) -> None:
    for _ in range(int(seconds * 4)):
        if await check():
            return
        await asyncio.sleep(0.25)
    raise AssertionError(f"never: {what}")


async def topic_copies(data: Path) -> tuple[list[bytes], list[bytes]]:
    """Every record of every topic of the running ``up`` read raw from offset 0, and what of
    them opens with the data keys a fresh process finds (shredded ones left out)."""
    state = read_state(data)
    assert state is not None
    bootstrap, dsn = str(state["kafka_bootstrap"]), str(state["postgres_dsn"])
    raw = [
        v
        for topic in Topics().all()
        for recs in (await read_topic(bootstrap, topic)).values()
        for _, v in recs
    ]
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    try:
        opened = [v for v in await Keyring(pool).open_many(raw) if v is not None]
    finally:
        await pool.close()
    return raw, opened


async def test_erase_user_then_replays_bring_nothing_back(
    traversable_tmp: Path, tmp_path: Path
) -> None:
    data = traversable_tmp / "erase-up"
    proc, url = start_up(data)
    try:
        res = cli("keys", "create", "acme", "--admin", "--data-dir", str(data))
        assert res.returncode == 0, res.stderr
        admin = res.stdout.strip()
        base = {"Authorization": f"Bearer {KEY}"}
        alice = base | {"X-Memstream-User": "alice"}
        bob = base | {"X-Memstream-User": "bob"}
        async with httpx.AsyncClient(base_url=url, timeout=60) as c:
            for agent in ("bot", "bot2"):
                r = await c.put(f"/v1/agents/{agent}", json={"memory": True}, headers=base)
                assert r.status_code == 200, r.text
            for thread in ("a1", "a2"):
                r = await c.post(
                    f"/v1/agents/bot/threads/{thread}/messages",
                    json={"role": "user", "content": f"my secret word is {SECRET}"},
                    headers=alice,
                )
                assert r.status_code == 201, r.text
            for thread, word in (("b1", KEPT), ("b2", "ephemeral-walrus")):
                r = await c.post(
                    f"/v1/agents/bot/threads/{thread}/messages",
                    json={"role": "user", "content": f"my word is {word}"},
                    headers=bob,
                )
                assert r.status_code == 201
            for h, word in ((alice, SECRET), (bob, KEPT)):
                r = await c.post(
                    "/v1/agents/bot/memory/store",
                    json={
                        "key": "word",
                        "content": f"the favourite word is {word}",
                        "category": "user_profile",
                        "scope": "private",
                    },
                    headers=h,
                )
                assert r.status_code == 200, r.text

            async def found(h: dict[str, str], word: str) -> bool:
                r = await c.post("/v1/agents/bot/journal/search", json={"query": word}, headers=h)
                return r.status_code == 200 and any(
                    word in x["content"] for x in r.json()["results"]
                )

            async def recalled(h: dict[str, str], word: str) -> bool:
                r = await c.post("/v1/agents/bot/memory/recall", json={"query": word}, headers=h)
                return any(word in x["content"] for x in r.json()["results"])

            await eventually(lambda: found(alice, SECRET), "alice's messages searchable")
            await eventually(lambda: found(bob, KEPT), "bob's messages searchable")
            await eventually(lambda: found(bob, "ephemeral-walrus"), "bob's b2 searchable")
            await eventually(lambda: recalled(alice, SECRET), "alice's entry recalled")
            # on the brokers, everything of a thread or user is sealed: no plaintext byte
            raw, opened = await topic_copies(data)
            assert any(is_sealed(v) for v in raw)
            assert all(SECRET.encode() not in v and KEPT.encode() not in v for v in raw)
            assert sum(SECRET.encode() in v for v in opened) >= 3  # 2 messages, 1 entry

            # bob erases one of his threads from the CLI; alice may not (not hers)
            res = cli("erase", "thread", "bot", "b2", "--key", KEY, "--user", "alice", "--url", url)
            assert res.returncode == 1 and "not_found" not in res.stdout
            res = cli("erase", "thread", "bot", "b2", "--key", KEY, "--user", "bob", "--url", url)
            assert res.returncode == 0, res.stdout + res.stderr
            assert "clickhouse" in res.stdout and "done" in res.stdout
            assert not await found(bob, "ephemeral-walrus")
            r = await c.get("/v1/agents/bot/threads/b2/context", headers=bob)
            assert r.status_code == 404

            # the memory commands: export every user's entries, import them into bot2
            exported = tmp_path / "bot.ndjson"
            res = cli("memory", "export", "bot", "--key", admin, "--url", url, "-o", str(exported))
            assert res.returncode == 0, res.stderr
            assert len(exported.read_text().splitlines()) == 2
            res = cli("memory", "import", "bot2", str(exported), "--key", admin, "--url", url)
            assert res.returncode == 0, res.stdout + res.stderr
            assert "created 2" in res.stdout
            res = cli("memory", "list", "bot2", "--key", admin, "--url", url, "--json")
            assert {e["user_id"] for e in json.loads(res.stdout)["entries"]} == {"alice", "bob"}

            res = cli("erase", "user", "alice", "--key", KEY, "--url", url)
            assert res.returncode == 1 and "needs an admin key" in res.stderr
            res = cli("erase", "user", "alice", "--key", admin, "--url", url)
            assert res.returncode == 0, res.stdout + res.stderr
            assert "done" in res.stdout and "journal_messages" in res.stdout

            async def nothing_of_alice() -> None:
                assert not await found(alice, SECRET)
                assert not await found(base, SECRET)
                assert not await recalled(alice, SECRET)
                for thread in ("a1", "a2"):
                    r = await c.get(f"/v1/agents/bot/threads/{thread}/context", headers=alice)
                    assert r.status_code == 404
                for agent in ("bot", "bot2"):
                    r = await c.get(
                        f"/v1/agents/{agent}/memory/export",
                        headers={"Authorization": f"Bearer {admin}"},
                    )
                    assert SECRET not in r.text and KEPT in r.text
                assert await found(bob, KEPT) and await recalled(bob, KEPT)
                assert not await found(bob, "ephemeral-walrus")  # the erased thread

            await nothing_of_alice()
            raw, opened = await topic_copies(data)  # crypto-shredded: her keys are gone
            assert all(SECRET.encode() not in v for v in raw + opened)
            assert sum(KEPT.encode() in v for v in opened) >= 2  # bob's message and entry
            for args in (
                ("replay", "messages", "--from-journal"),
                ("replay", "messages"),
                ("replay", "memory"),
            ):
                res = cli(*args, "--data-dir", str(data))
                assert res.returncode == 0, f"{args}: {res.stdout}{res.stderr}"
                await nothing_of_alice()
            raw, opened = await topic_copies(data)
            assert all(SECRET.encode() not in v for v in raw + opened)
            assert any(KEPT.encode() in v for v in opened)
    finally:
        assert stop_up(proc) == []
