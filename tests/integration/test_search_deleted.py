"""Transcript search never returns a message of a deleted thread (docs/access.md: deleted is
404 on every route), over HTTP with two users and an anonymous caller, on every search path
(BM25 from the posting lists or the lexical index; with the dense side from a ClickHouse
scan or the vector index): a deleted shared thread and a deleted private thread are found
by nobody, in either scope, while other threads still are and ``limit`` is filled with
them; revived, both are found again."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from memstream.infra.embeddings import CachingEmbedder
from memstream.projections.messages import ChdbEngine, MessageStore
from memstream.projections.messages.vector_index import close_vector_indexes
from memstream.projections.messages.vectors import MessageVectors
from tests.fixtures.api import ApiStack
from tests.integration.test_journal_tools_http import append, project_thread

pytestmark = pytest.mark.asyncio(loop_scope="session")

# The deleted threads' messages are the best matches (short, the word twice), so a search
# that dropped them after its query would return fewer than ``limit``.
GONE_TEXT = "quokka quokka"
LIVE_TEXT = "a quokka was seen near the old river bridge this morning, {}"


@pytest_asyncio.fixture(
    loop_scope="session", params=["postings", "tantivy", "dense-scan", "dense-index"]
)
async def store(
    request: pytest.FixtureRequest,
    chdb_engine: ChdbEngine,
    embedder: CachingEmbedder,
    tmp_path: Path,
) -> AsyncIterator[MessageStore]:
    kind = str(request.param)
    store = MessageStore(
        chdb_engine,
        database=f"t_{uuid.uuid4().hex[:12]}",
        embedder=embedder if kind.startswith("dense") else None,
        index_root=tmp_path / "tv" if kind in ("tantivy", "dense-index") else None,
        vector_root=tmp_path / "vectors" if kind == "dense-index" else None,
    )
    await store.ensure_schema()
    yield store
    await store.close()
    await close_vector_indexes(tmp_path)


class Searcher:
    def __init__(self, stack: ApiStack, agent: str) -> None:
        self.stack, self.agent = stack, agent

    async def __call__(
        self, user: str | None, *, limit: int = 50, thread: str | None = None
    ) -> list[tuple[str, int]]:
        body: dict[str, Any] = {"query": "quokka", "limit": limit, "summarize": True}
        if thread is not None:
            body |= {"scope": "current_thread", "thread_id": thread}
        r = await self.stack.client.post(
            f"/v1/agents/{self.agent}/journal/search", json=body, headers=self.stack.headers(user)
        )
        assert r.status_code == 200, r.text
        found = r.json()
        hits = [(h["thread_id"], h["offset"]) for h in found["results"]]
        # a summary only of threads with a hit
        assert {s["thread_id"] for s in found["summaries"]} == {t for t, _ in hits}
        return hits


def threads_of(hits: list[tuple[str, int]]) -> set[str]:
    return {t for t, _ in hits}


async def test_deleted_threads_are_not_searched_until_revived(
    api_stack: ApiStack, store: MessageStore, embedder: CachingEmbedder
) -> None:
    s = api_stack
    s.services.message_store = store
    agent = f"ag-del-{uuid.uuid4().hex[:8]}"
    threads: dict[str, str | None] = {
        "shared-gone": None,
        "alice-gone": "alice",
        "shared-live": None,
        "alice-live": "alice",
        "bob-live": "bob",
    }
    for thread, user in threads.items():
        texts = (
            [GONE_TEXT, GONE_TEXT]
            if thread.endswith("-gone")
            else [LIVE_TEXT.format(i) for i in range(4 if thread == "shared-live" else 2)]
        )
        msgs: list[dict[str, Any]] = [{"role": "user", "content": t} for t in texts]
        if thread == "shared-gone":  # a tool call: its view is 404 while deleted
            msgs.append(
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{"id": "c-gone", "name": "zoo", "arguments": {}}],
                }
            )
        await append(s, agent, thread, {"messages": msgs}, user=user)
        await project_thread(s, store, agent, thread)
    if store.embedder is not None:
        await MessageVectors(store, embedder).catch_up()
    search = Searcher(s, agent)
    anon, alice, bob = None, "alice", "bob"
    visible = {
        anon: {"shared-gone", "shared-live"},
        alice: {"shared-gone", "shared-live", "alice-gone", "alice-live"},
        bob: {"shared-gone", "shared-live", "bob-live"},
    }
    for user, expected in visible.items():  # before: every thread the caller may read
        assert threads_of(await search(user)) == expected
    tool_call = f"/v1/agents/{agent}/journal/tool-calls/c-gone"
    assert (await s.client.get(tool_call, headers=s.headers())).status_code == 200

    for thread, user in (("shared-gone", anon), ("alice-gone", alice)):
        r = await s.client.delete(f"/v1/agents/{agent}/threads/{thread}", headers=s.headers(user))
        assert r.status_code == 204, r.text

    gone = {"shared-gone", "alice-gone"}
    for user, expected in visible.items():
        assert threads_of(await search(user)) == expected - gone
        # the deleted threads' messages rank best: ``limit`` is still filled, with others
        hits = await search(user, limit=3)
        assert len(hits) == 3 and not threads_of(hits) & gone, (user, hits)
        for thread in gone:
            assert await search(user, thread=thread) == []
        assert threads_of(await search(user, thread="shared-live")) == {"shared-live"}
    assert threads_of(await search(alice, thread="alice-live")) == {"alice-live"}
    assert (await s.client.get(tool_call, headers=s.headers())).status_code == 404

    for thread, user in (("shared-gone", anon), ("alice-gone", alice)):
        r = await s.client.post(
            f"/v1/agents/{agent}/threads",
            json={"thread_id": thread, "metadata": {}},
            headers=s.headers(user),
        )
        assert r.status_code in (200, 201), r.text

    for user, expected in visible.items():  # revived: found again
        assert threads_of(await search(user)) == expected
    assert threads_of(await search(alice, thread="alice-gone")) == {"alice-gone"}
    assert threads_of(await search(bob, thread="shared-gone")) == {"shared-gone"}
    assert await search(bob, thread="alice-gone") == []
    assert (await s.client.get(tool_call, headers=s.headers())).status_code == 200
