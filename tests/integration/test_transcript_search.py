"""Transcript search against real chdb: hits, misses, ranking, scope, tenancy, privacy,
roles never searchable, limits, summaries, replay/redelivery."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio

from memstream.agents_ctx.journal_tools import NoDeletedThreads, journal_message_search
from memstream.errors import InvalidRequest
from memstream.infra.llm import ExtractiveSummaryModel
from memstream.projections.messages import MessageStore, SearchHit
from memstream.schemas.events import message_appended
from memstream.schemas.records import Caller, Message, Role, ToolCall
from memstream.streams.message_projector import rows_of_batch


@pytest_asyncio.fixture(loop_scope="session")
async def message_store(any_store: MessageStore) -> MessageStore:
    """Every test here runs on both lexical paths: the posting lists and the index."""
    return any_store


T0 = datetime(2026, 2, 1, tzinfo=UTC)


def m(
    thread: str,
    offset: int,
    role: Role,
    content: str,
    *,
    account: str = "acc",
    agent: str = "ag",
    user: str | None = None,
    minutes: int = 0,
    **kw: object,
) -> Message:
    return Message(
        account_id=account,
        agent_id=agent,
        thread_id=thread,
        offset=offset,
        message_id=f"{account}-{agent}-{thread}-{offset}",
        role=role,
        content=content,
        created_at=T0 + timedelta(minutes=minutes),
        user_id=user,
        **kw,  # type: ignore[arg-type]  # Message's other fields, as each test gives them
    )


async def project(store: MessageStore, msgs: Sequence[Message]) -> None:
    await store.write(rows_of_batch(message_appended(x, ts=1) for x in msgs))


class CountingSummarizer:
    def __init__(self) -> None:
        self.calls: list[list[Message]] = []
        self._inner = ExtractiveSummaryModel()

    async def summarize(
        self, previous: str | None, messages: Sequence[Message], token_budget: int
    ) -> str:
        self.calls.append(list(messages))
        return await self._inner.summarize(previous, messages, token_budget)


CORPUS = [
    m("t1", 0, "system", "You are a travel agent. Secret system prompt zebra."),
    m("t1", 1, "user", "I want to book a flight to Lisbon in May"),
    m(
        "t1",
        2,
        "assistant",
        "Sure, flights to Lisbon in May start at 120 euros",
        reasoning="thinking about zebra prices and hidden reasoning",
        minutes=1,
    ),
    m("t1", 3, "tool", "zebra tool result text", tool_call_id="tc-9", minutes=2),
    m("t2", 0, "user", "What is the weather in Lisbon?", minutes=5),
    m("t2", 1, "assistant", "Sunny and warm in LISBON today.", minutes=6),
    m("t3", 0, "user", "my favourite colour is blue", minutes=7),
    m(
        "t3",
        1,
        "assistant",
        "noted",
        tool_calls=(ToolCall("tc-1", "remember", {"x": 1}),),
        minutes=8,
    ),
    # another agent and another account: never visible to acc/ag
    m("t1", 0, "user", "Lisbon flight for another agent", agent="ag2"),
    m("t1", 0, "user", "Lisbon flight for another account", account="acc2"),
    # private threads
    m("p-alice", 0, "user", "alice private note about Lisbon rent", user="alice", minutes=9),
    m("p-alice", 1, "assistant", "I will keep your Lisbon rent in mind", minutes=10),
    m("p-bob", 0, "user", "bob private Lisbon diary", user="bob", minutes=11),
]

CALLER = Caller("acc", "ag", None)
ALICE = Caller("acc", "ag", "alice")


@pytest.fixture
async def corpus(message_store: MessageStore) -> MessageStore:
    await project(message_store, CORPUS)
    return message_store


async def search(store: MessageStore, caller: Caller = CALLER, **kw: Any) -> list[tuple[str, int]]:
    kw.setdefault("summarize", False)
    res = await journal_message_search(
        caller,
        kw.pop("query"),
        store=store,
        summarizer=ExtractiveSummaryModel(),
        threads=NoDeletedThreads(),
        **kw,
    )
    return [(h.thread_id, h.offset) for h in res.results]


def explained(hit: SearchHit) -> dict[str, Any]:
    """The score's parts of a hit found with ``explain``: JSON, navigated by the test."""
    assert hit.explain is not None
    return hit.explain


async def test_hits_misses_and_case(corpus: MessageStore) -> None:
    assert set(await search(corpus, query="lisbon")) == {("t1", 1), ("t1", 2), ("t2", 0), ("t2", 1)}
    # the message holding both terms ranks first; messages sharing one term follow
    hits = await search(corpus, query="LiSbOn WEATHER")
    assert hits[0] == ("t2", 0) and set(hits) == {("t1", 1), ("t1", 2), ("t2", 0), ("t2", 1)}
    assert await search(corpus, query="tokyo") == []
    # OR, not AND: a word no message holds does not hide the ones that match
    assert set(await search(corpus, query="lisbon tokyo")) == set(
        await search(corpus, query="lisbon")
    )


async def test_ranking_relevance_then_recency(corpus: MessageStore) -> None:
    # "flights lisbon may": t1/2 has all three terms, t1/1 two of them ("flight" stems alike)
    hits = await search(corpus, query="flights Lisbon May")
    assert hits[:2] == [("t1", 2), ("t1", 1)]
    # t2's messages use "lisbon" more densely than t1's; within equal density, newest first.
    assert await search(corpus, query="lisbon") == [("t2", 1), ("t2", 0), ("t1", 2), ("t1", 1)]


async def test_relevance_beats_recency(message_store: MessageStore) -> None:
    await project(
        message_store,
        [
            m("old", 0, "user", "blue whale", minutes=0),
            m("new", 0, "user", "we saw a whale that was large and very blue", minutes=60),
            m("phrase", 0, "user", "blue whale sightings near the coast of the island", minutes=1),
        ],
    )
    assert await search(message_store, query="blue whale") == [
        ("old", 0),  # dense and exact phrase
        ("phrase", 0),  # exact phrase, longer
        ("new", 0),  # newest, but neither dense nor the phrase
    ]


async def test_system_reasoning_and_tool_results_never_returned(corpus: MessageStore) -> None:
    for caller in (CALLER, ALICE, Caller("acc", "ag", "bob")):
        assert await search(corpus, caller, query="zebra") == []
        assert await search(corpus, caller, query="secret system prompt") == []
        assert await search(corpus, caller, query="hidden reasoning") == []


async def test_scope_current_thread(corpus: MessageStore) -> None:
    assert set(await search(corpus, query="lisbon", scope="current_thread", thread_id="t2")) == {
        ("t2", 0),
        ("t2", 1),
    }
    assert await search(corpus, query="weather", scope="current_thread", thread_id="t1") == []


async def test_tenancy_account_and_agent(corpus: MessageStore) -> None:
    assert await search(corpus, query="another") == []
    assert await search(corpus, Caller("acc", "ag2", None), query="lisbon") == [("t1", 0)]
    assert await search(corpus, Caller("acc2", "ag", None), query="lisbon") == [("t1", 0)]


async def test_private_threads_only_for_their_user(corpus: MessageStore) -> None:
    alice = set(await search(corpus, ALICE, query="lisbon"))
    assert {("p-alice", 0), ("p-alice", 1)} <= alice  # including the assistant's reply
    assert not any(t == "p-bob" for t, _ in alice)
    bob = set(await search(corpus, Caller("acc", "ag", "bob"), query="lisbon"))
    assert ("p-bob", 0) in bob and not any(t == "p-alice" for t, _ in bob)
    anonymous = set(await search(corpus, query="lisbon"))
    assert not any(t.startswith("p-") for t, _ in anonymous)
    # shared threads stay visible to users
    assert ("t2", 0) in alice


@pytest.mark.parametrize("indexed", [False, True], ids=["sql", "lexical-index"])
async def test_the_operators_search_reads_every_users_threads(
    indexed: bool, message_store: MessageStore, indexed_store: MessageStore
) -> None:
    """The console's search (``every_user``): an operator sees every user's threads, as
    docs/console.md says (it used to see only the threads without users); other agents and
    accounts stay out, and agent callers keep their own rule."""
    store = indexed_store if indexed else message_store
    await project(store, CORPUS)
    every = set(await search(store, query="lisbon", every_user=True, limit=50))
    assert {("p-alice", 0), ("p-alice", 1), ("p-bob", 0), ("t2", 0), ("t1", 1)} <= every
    assert ("t1", 0) not in every  # that Lisbon line is another agent's (and account's) t1
    assert not any(t.startswith("p-") for t, _ in await search(store, query="lisbon"))


async def test_limit_bounds(corpus: MessageStore) -> None:
    assert len(await search(corpus, ALICE, query="lisbon", limit=1)) == 1
    assert len(await search(corpus, ALICE, query="lisbon", limit=50)) == 6
    for bad in (0, 51):
        with pytest.raises(InvalidRequest) as e:
            await search(corpus, query="lisbon", limit=bad)
        assert e.value.field == "limit"


async def test_summaries_one_call_per_matching_thread(corpus: MessageStore) -> None:
    model = CountingSummarizer()
    res = await journal_message_search(
        ALICE, "lisbon", store=corpus, summarizer=model, threads=NoDeletedThreads()
    )
    threads = list(dict.fromkeys(h.thread_id for h in res.results))
    assert len(model.calls) == len(threads) == 3
    assert [s.thread_id for s in res.summaries] == threads
    assert all(s.content for s in res.summaries)
    by_thread = {call[0].thread_id: call for call in model.calls}
    assert [x.offset for x in by_thread["t1"]] == [1, 2]  # the thread's hits, in order
    out: Any = res.to_dict()  # JSON, navigated by the test
    assert set(out) == {"results", "summaries"}
    assert set(out["results"][0]) == {
        "thread_id",
        "message_id",
        "offset",
        "role",
        "content",
        "created_at",
    }


async def test_replay_and_redelivery_leave_no_duplicates(corpus: MessageStore) -> None:
    before = await search(corpus, ALICE, query="lisbon", limit=50)
    await project(corpus, CORPUS)  # a full replay
    await project(corpus, CORPUS[4:6])  # a redelivered batch
    after = await search(corpus, ALICE, query="lisbon", limit=50)
    assert after == before and len(after) == len(set(after))
    stored, distinct = await corpus.thread_row_counts("acc", "ag", "t2")
    assert stored > distinct == 2  # duplicates exist on disk before a merge...
    await corpus.optimize()
    assert await corpus.thread_row_counts("acc", "ag", "t2") == (2, 2)  # ...and collapse
    assert await search(corpus, ALICE, query="lisbon", limit=50) == before


async def test_odd_characters_in_queries_and_ids(message_store: MessageStore) -> None:
    await project(
        message_store,
        [m("t'1\\x", 0, "user", "Grüße aus München, it's über-cool", user="o'neil")],
    )
    who = Caller("acc", "ag", "o'neil")
    assert await search(message_store, who, query="MÜNCHEN grüße") == [("t'1\\x", 0)]
    assert await search(message_store, who, query="it's") == [("t'1\\x", 0)]
    assert await search(message_store, query="münchen") == []  # private to o'neil


async def test_current_thread_scope_keeps_privacy(corpus: MessageStore) -> None:
    scoped = {"query": "lisbon", "scope": "current_thread", "thread_id": "p-alice"}
    assert set(await search(corpus, ALICE, **scoped)) == {("p-alice", 0), ("p-alice", 1)}
    assert await search(corpus, Caller("acc", "ag", "bob"), **scoped) == []
    assert await search(corpus, CALLER, **scoped) == []
