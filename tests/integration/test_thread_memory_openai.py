"""The OpenAI providers against the local OpenAI-compatible test server
(``tests.fixtures.openai_server``) that records every request and answers
``chat.completions``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from openai import AsyncOpenAI

from memstream.infra.llm import OpenAIFactExtractor, OpenAISummaryModel, build_models
from memstream.infra.settings import Settings
from memstream.infra.tokenizer import count_tokens
from memstream.schemas.records import Message
from tests.fixtures.openai_server import FakeOpenAI

MODEL = "test-summarizer-1"


@pytest.fixture
def server(openai_server: tuple[FakeOpenAI, str]) -> tuple[FakeOpenAI, str]:
    return openai_server


def msg(i: int, content: str) -> Message:
    return Message("a", "g", "t", i, f"m{i}", "user", content, datetime(2026, 1, 1, tzinfo=UTC))


def client(base_url: str) -> AsyncOpenAI:
    return AsyncOpenAI(api_key="sk-test", base_url=base_url)


async def test_summary_request_carries_model_and_previous_summary(
    server: tuple[FakeOpenAI, str],
) -> None:
    fake, url = server
    fake.requests.clear()
    fake.answers.append("The user is Ada. She ships on Fridays.")
    model = OpenAISummaryModel(client(url), MODEL)
    out = await model.summarize(
        "PREVIOUS: the user is called Ada.", [msg(0, "We deploy every Friday.")], 100
    )
    assert out == "The user is Ada. She ships on Fridays."
    (req,) = fake.requests
    assert req["model"] == MODEL
    text = "\n".join(m["content"] for m in req["messages"])
    assert "PREVIOUS: the user is called Ada." in text
    assert "We deploy every Friday." in text
    assert req["max_completion_tokens"] == 100


async def test_overlong_model_answer_is_cut_to_budget(server: tuple[FakeOpenAI, str]) -> None:
    fake, url = server
    fake.answers.append("\n".join(f"Line {i} says something long enough." for i in range(200)))
    out = await OpenAISummaryModel(client(url), MODEL).summarize(None, [msg(0, "hi")], 40)
    assert 0 < count_tokens(out) <= 40


async def test_fact_extraction_request_and_parsing(server: tuple[FakeOpenAI, str]) -> None:
    fake, url = server
    fake.requests.clear()
    fake.answers.append(
        '{"facts": [{"key": "user.name", "content": "The user is Ada.",'
        ' "category": "user_profile", "importance": 0.9}]}'
    )
    facts = await OpenAIFactExtractor(client(url), MODEL).extract([msg(0, "I am Ada.")])
    assert [(f.key, f.category, f.importance) for f in facts] == [
        ("user.name", "user_profile", 0.9)
    ]
    (req,) = fake.requests
    assert req["model"] == MODEL
    assert req["response_format"] == {"type": "json_object"}
    assert "I am Ada." in req["messages"][-1]["content"]


async def test_settings_select_the_openai_path(server: tuple[FakeOpenAI, str]) -> None:
    fake, url = server
    fake.requests.clear()
    summary_model, _ = build_models(
        Settings(llm_provider="openai", openai_base_url=url, openai_chat_model=MODEL)
    )
    await summary_model.summarize("v1 content", [msg(0, "more")], 50)
    assert fake.requests[-1]["model"] == MODEL


async def test_summarizer_chains_versions_through_the_openai_path(
    server: tuple[FakeOpenAI, str], journal: Any, redis_client: Any, tmp_path: Any
) -> None:
    from obstore.store import LocalStore

    from memstream.infra.summary_store import SummaryStore
    from memstream.infra.thread_state import ThreadState
    from memstream.schemas.records import NewMessage, ThreadRef
    from memstream.streams.summarizer import SummarizerProcessor

    fake, url = server
    fake.requests.clear()
    fake.answers += ["SUMMARY-V1: the user is Ada.", "SUMMARY-V2: Ada, Fridays."]
    ref = ThreadRef("acc", "openai-agent", "t1")
    store = SummaryStore(LocalStore(prefix=tmp_path / "objects", mkdir=True), redis_client)
    s = SummarizerProcessor(
        journal, ThreadState(redis_client), store, OpenAISummaryModel(client(url), MODEL)
    )
    await journal.append(ref, [NewMessage(role="user", content=f"m{i}") for i in range(50)])
    v1 = await s.summarize(ref, 49)
    await journal.append(ref, [NewMessage(role="user", content=f"n{i}") for i in range(50)])
    v2 = await s.summarize(ref, 99)
    assert v1 is not None and v1.content == "SUMMARY-V1: the user is Ada."
    assert v2 is not None and v2.version == 2 and v2.content == "SUMMARY-V2: Ada, Fridays."
    second = "\n".join(m["content"] for m in fake.requests[1]["messages"])
    assert "SUMMARY-V1: the user is Ada." in second  # v2's call saw v1
    assert "n49" in second and "m49" not in second  # only the new span is sent
