"""Ranked transcript search on real chdb, the way people ask: questions with words the
evidence lacks, other word forms, many distractor turns; the analyzer's SQL and Python
halves agree; a table made before ranked search is upgraded in place; explain."""

from __future__ import annotations

import uuid
from typing import Any

import pytest_asyncio

from memstream.agents_ctx.journal_tools import NoDeletedThreads, journal_message_search
from memstream.infra.llm import ExtractiveSummaryModel
from memstream.projections.analyzer import query_terms, terms, terms_sql
from memstream.projections.messages import MessageStore
from memstream.projections.messages.chdb_engine import ChdbEngine
from memstream.schemas.records import Caller
from tests.integration.test_transcript_search import m, project, search


@pytest_asyncio.fixture(loop_scope="session")
async def message_store(any_store: MessageStore) -> MessageStore:
    """Every test here runs on both lexical paths: the posting lists and the index."""
    return any_store


# A long two-speaker conversation: the evidence turns are buried among everyday chatter.
FILLER = [
    "How was your day today?",
    "Pretty good, I went for a walk and made some tea.",
    "Did you watch the game last night?",
    "Not really, I was busy cooking dinner for the family.",
    "The weather has been strange this week.",
    "I know, it rained all morning and then the sun came out.",
    "Work was hectic, lots of meetings and emails.",
    "Let's catch up properly on the weekend.",
]
EVIDENCE = {
    ("conv", 101): "Caroline went to the LGBTQ support group on Tuesday evening.",
    ("conv", 202): "Melanie painted a sunrise over the lake last summer.",
    ("conv", 303): "I adopted two kittens from the shelter downtown.",
    ("conv", 404): "My sister is moving to Portugal for her new job in March.",
}


async def _conversation(store: MessageStore) -> None:
    msgs = []
    for i in range(480):
        text = EVIDENCE.get(("conv", i), FILLER[i % len(FILLER)] + f" ({i})")
        msgs.append(m("conv", i, "user" if i % 2 == 0 else "assistant", text, minutes=i))
    await project(store, msgs)


async def test_questions_find_their_evidence_turn(message_store: MessageStore) -> None:
    await _conversation(message_store)
    cases = {
        "When did Caroline go to the support group?": ("conv", 101),
        "what did Melanie paint?": ("conv", 202),
        "How many kittens were adopted, and where from?": ("conv", 303),
        "Where is the sister moving for work?": ("conv", 404),
    }
    for question, evidence in cases.items():
        hits = await search(message_store, query=question, limit=5)
        assert hits, question  # never empty when a term matches
        assert hits[0] == evidence, (question, hits)


async def test_extra_words_never_hide_the_answer(message_store: MessageStore) -> None:
    await _conversation(message_store)
    hits = await search(
        message_store, query="kittens zanzibar quantum hovercraft telescope", limit=3
    )
    assert hits[0] == ("conv", 303)


async def test_other_word_forms_match(message_store: MessageStore) -> None:
    await _conversation(message_store)
    assert (await search(message_store, query="painting", limit=3))[0] == ("conv", 202)
    assert (await search(message_store, query="kitten adoption", limit=3))[0] == ("conv", 303)
    assert (await search(message_store, query="moves", limit=3))[0] == ("conv", 404)


async def test_privacy_holds_with_or_matching(message_store: MessageStore) -> None:
    await project(
        message_store,
        [
            m("mine", 0, "user", "my rent in Lisbon is high", user="alice"),
            m("theirs", 0, "user", "bob pays rent for a flat", user="bob"),
            m("shared", 0, "user", "rent prices rose everywhere"),
        ],
    )
    alice = Caller("acc", "ag", "alice")
    assert set(await search(message_store, alice, query="rent Lisbon flat")) == {
        ("mine", 0),
        ("shared", 0),
    }
    assert set(await search(message_store, query="rent Lisbon flat")) == {("shared", 0)}


async def test_explain_gives_score_parts(message_store: MessageStore) -> None:
    await _conversation(message_store)
    res = await journal_message_search(
        Caller("acc", "ag", None),
        "Caroline support group",
        summarize=False,
        explain=True,
        store=message_store,
        summarizer=ExtractiveSummaryModel(),
        threads=NoDeletedThreads(),
    )
    body: Any = res.to_dict()  # JSON, navigated by the test
    top = body["results"][0]
    assert top["offset"] == 101
    parts = top["explain"]
    assert parts["terms"]["carolin"] == {"tf": 1, "df": 1}  # stemmed: final e dropped
    assert parts["messages"] == 480 and parts["bm25"] > 0 and parts["proximity"] > 0
    assert top["score"] >= parts["bm25"]
    plain = await journal_message_search(
        Caller("acc", "ag", None),
        "Caroline support group",
        summarize=False,
        store=message_store,
        summarizer=ExtractiveSummaryModel(),
        threads=NoDeletedThreads(),
    )
    plain_body: Any = plain.to_dict()
    assert "explain" not in plain_body["results"][0]


async def test_analyzer_sql_and_python_agree(chdb_engine: ChdbEngine) -> None:
    words = (
        "Running runs ran flies flied studies studied stopped hopping agreed glasses "
        "Lisbon's café naïve ÉLAN 2024 x86_64 e-mail don't it's bus buses going made "
        "making loves loved boxes classes analysis happily"
    )
    rows = await chdb_engine.rows(f"SELECT {terms_sql('{t:String}')}", {"t": words})
    from_sql = rows[0][0]
    sql_terms = list(from_sql) if isinstance(from_sql, list | tuple) else None
    assert sql_terms is not None, from_sql
    assert [str(t) for t in sql_terms] == terms(words)


def test_query_terms_drop_stop_words_unless_nothing_else() -> None:
    assert query_terms("When did Caroline go to the support group?") == (
        "carolin",
        "go",
        "support",
        "group",
    )
    assert query_terms("who is it") == ("who", "is", "it")
    assert query_terms("Cafés CAFÉS café") == ("cafés", "café")


async def test_table_from_before_ranked_search_is_upgraded(chdb_engine: ChdbEngine) -> None:
    db = f"t_{uuid.uuid4().hex[:12]}"
    await chdb_engine.command(f"CREATE DATABASE {db}")
    await chdb_engine.command(
        f"""CREATE TABLE {db}.messages (
    account_id LowCardinality(String), agent_id LowCardinality(String), thread_id String,
    `offset` UInt64, message_id String, role LowCardinality(String), content String,
    user_id String, tool_call_ids Array(String), created_at DateTime64(3, 'UTC'), seq UInt64,
    INDEX content_tokens content
        TYPE text(tokenizer = splitByNonAlpha, preprocessor = lowerUTF8(content))
) ENGINE = ReplacingMergeTree(seq) PARTITION BY toYear(created_at)
ORDER BY (account_id, agent_id, thread_id, `offset`)"""
    )
    await chdb_engine.command(
        f"INSERT INTO {db}.messages VALUES ('acc', 'ag', 'old', 0, 'm0', 'user', "
        "'We adopted kittens last spring', '', [], '2026-01-01 00:00:00', 1)"
    )
    store = MessageStore(chdb_engine, database=db)
    await store.ensure_schema()
    await store.ensure_schema()  # idempotent
    assert await search(store, query="kitten") == [("old", 0)]
