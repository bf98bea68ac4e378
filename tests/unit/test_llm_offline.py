"""Offline model providers: the extractive summarizer and the rule-based fact extractor."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memstream.infra.llm import ExtractiveSummaryModel, RuleFactExtractor
from memstream.infra.llm.facts import RULES, extract_facts
from memstream.infra.llm.openai_models import fit_budget, parse_facts
from memstream.infra.llm.summary import _states_fact, extractive_summary
from memstream.infra.tokenizer import count_tokens
from memstream.schemas.records import Message, Role

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def msg(i: int, role: Role, content: str) -> Message:
    return Message("acc", "agt", "thr", i, f"m{i}", role, content, T0)


CHAT = [
    msg(0, "user", "Hi! My name is Ada Lovelace and I live in London."),
    msg(1, "assistant", "Nice to meet you, Ada. How can I help today?"),
    msg(2, "user", "We use Postgres and Kafka for our ingestion pipeline. I prefer short answers."),
    msg(
        3,
        "assistant",
        "Understood. Postgres stores the authoritative rows; Kafka carries the events "
        "between the ingestion services and the projections.",
    ),
    msg(4, "user", "ok thanks"),
    msg(5, "user", "Remember that the deploy happens every Friday at 5pm."),
]

FILLER = [
    msg(
        10 + i,
        "assistant",
        f"Step {i}: tune the consumer fetch size for partition {i} and watch the lag "
        f"dashboard for regressions in batch {i}.",
    )
    for i in range(30)
]


@pytest.mark.parametrize("budget", [1, 5, 20, 60, 200, 2_000])
def test_summary_respects_the_token_budget(budget: int) -> None:
    text = extractive_summary(None, CHAT + FILLER, budget)
    assert count_tokens(text) <= budget
    if budget >= 5:
        assert text  # something always fits, even if truncated


_FACT_WORDS = [
    "my name is",
    "call me",
    "i live in",
    "i'm based in",
    "i work at",
    "i am working for",
    "i really prefer",
    "my favourite",
    "my favorite color is",
    "please remember that",
    "remember that",
    "we use",
    "we're using",
    "we rely on",
    "our project",
    "our team",
    "Ada",
    "London",
    "tea",
    "and",
    "but",
    "because",
    ".",
    "!",
    "?",
    "\n",
    "x",
]


@given(st.lists(st.sampled_from(_FACT_WORDS), max_size=12).map(" ".join) | st.text(max_size=80))
def test_the_one_fact_pattern_matches_exactly_when_a_rule_does(text: str) -> None:
    """The summarizer's boost for stated facts asks one alternation of the rules instead of
    each rule in turn: the answer must be the rules' own, on any text."""
    assert _states_fact(text) == any(rule.pattern.search(text) for rule in RULES)
    for line in (f"User: {text}", text.upper()):
        assert _states_fact(line) == any(rule.pattern.search(line) for rule in RULES)


_ONE_PER_RULE = [
    "My name is Ada Lovelace.",
    "I live in London but travel a lot.",
    "I work at the Analytical Engine Company.",
    "I really prefer short answers.",
    "My favourite editor is vim.",
    "Please remember that the deploy is on Fridays.",
    "We use Postgres and Kafka.",
    "Our project is called Orion.",
]


def test_the_one_fact_pattern_answers_for_every_rule() -> None:
    """Sentence i states what rule i (and no other) catches, so a rule missing from the one
    pattern fails here whatever the generated texts above happen to be."""
    for i, rule in enumerate(RULES):
        assert [bool(rule.pattern.search(t)) for t in _ONE_PER_RULE] == [
            j == i for j in range(len(RULES))
        ], i
    for text in _ONE_PER_RULE:
        assert _states_fact(text) and _states_fact("User: " + text), text
    assert not _states_fact("The weather is nice today.")


def test_summary_is_deterministic() -> None:
    a = extractive_summary(None, CHAT + FILLER, 120)
    b = extractive_summary(None, list(CHAT + FILLER), 120)
    assert a == b


def test_summary_prefers_stated_facts_over_filler() -> None:
    text = extractive_summary(None, CHAT, 60)
    assert "My name is Ada Lovelace" in text
    assert "ok thanks" not in text


def test_progressive_summary_keeps_old_facts() -> None:
    v1 = extractive_summary(None, CHAT, 80)
    assert "Ada Lovelace" in v1
    v2 = extractive_summary(v1, FILLER, 80)
    assert "Ada Lovelace" in v2  # carried over from the previous summary
    assert "Step" in v2  # and the new span is represented
    v3 = extractive_summary(v2, FILLER[::-1], 80)
    assert "Ada Lovelace" in v3


def test_summary_keeps_conversation_order() -> None:
    text = extractive_summary(None, CHAT, 500)
    lines = text.splitlines()
    assert lines[0].startswith("User: Hi!")
    assert lines.index("User: I prefer short answers.") > lines.index("User: Hi!")


def test_empty_input_gives_empty_summary() -> None:
    assert extractive_summary(None, [], 100) == ""
    assert extractive_summary("User: My name is Ada.", [], 0) == ""


async def test_summary_model_port() -> None:
    text = await ExtractiveSummaryModel().summarize("User: My name is Ada.", CHAT[1:2], 50)
    assert "My name is Ada" in text


def test_extractor_finds_explicit_statements() -> None:
    facts = {f.key: f for f in extract_facts(CHAT)}
    assert facts["user.name"].content == "The user's name is Ada Lovelace."
    assert facts["user.name"].category == "user_profile"
    assert facts["user.name"].importance >= 0.7  # pinned
    assert facts["user.location"].content == "The user lives in London."
    uses = [f for k, f in facts.items() if k.startswith("project.uses.")]
    assert len(uses) == 1
    assert "Postgres and Kafka" in uses[0].content
    assert uses[0].category == "project_fact"
    assert facts["user.prefers.short-answers"].category == "user_profile"
    notes = [f for k, f in facts.items() if k.startswith("note.")]
    assert len(notes) == 1
    assert "every Friday at 5pm" in notes[0].content


def test_extractor_keys_are_deterministic_and_last_statement_wins() -> None:
    facts = extract_facts(
        [
            msg(0, "user", "My name is Ada."),
            msg(1, "user", "Actually, call me Countess."),
        ]
    )
    assert [f.key for f in facts] == ["user.name"]
    assert facts[0].content == "The user's name is Countess."


def test_extractor_ignores_questions_and_assistant_statements() -> None:
    facts = extract_facts(
        [
            msg(0, "user", "Do you remember that my name is Bob?"),
            msg(1, "assistant", "My name is Claude and I live in the cloud."),
            msg(2, "user", "Nothing to see here."),
        ]
    )
    assert facts == []


def test_extractor_categories() -> None:
    facts = {
        f.key: f
        for f in extract_facts(
            [
                msg(0, "user", "Our project is called Memstream. I work at Acme Corp."),
                msg(1, "user", "Remember that I am allergic to peanuts."),
                msg(2, "user", "Remember that the office closes at noon on Fridays."),
                msg(3, "user", "My favorite editor is Helix."),
            ]
        )
    }
    assert facts["project.name"].content == "The user's project is called Memstream."
    assert facts["project.name"].category == "project_fact"
    assert facts["user.employer"].content == "The user works at Acme Corp."
    cats = sorted(f.category for k, f in facts.items() if k.startswith("note."))
    assert cats == ["observation", "user_profile"]
    assert facts["user.favorite.editor"].content == "The user's favorite editor is Helix."


async def test_extractor_port() -> None:
    facts = await RuleFactExtractor().extract(CHAT)
    assert all(0.0 <= f.importance <= 1.0 for f in facts)


def test_openai_answer_parsing_drops_malformed_facts() -> None:
    facts = parse_facts(
        '{"facts": [{"key": "user.name", "content": "Name is Ada", "category": "user_profile",'
        ' "importance": 3}, {"content": "x", "category": "bogus"}, "junk",'
        ' {"content": "Uses Rust", "category": "project_fact"}]}'
    )
    assert [(f.key, f.importance) for f in facts] == [("user.name", 1.0), ("uses-rust", 0.5)]
    assert parse_facts("not json") == []


def test_fit_budget_cuts_an_overlong_answer() -> None:
    text = "\n".join(f"line {i} with several words in it" for i in range(100))
    out = fit_budget(text, 30)
    assert count_tokens(out) <= 30
    assert out.startswith("line 0")


def test_openai_calls_are_bounded_and_fit_in_the_summary_lock() -> None:
    import pytest
    from pydantic import ValidationError

    from memstream.infra.llm import build_models
    from memstream.infra.llm.openai_models import OpenAISummaryModel
    from memstream.infra.settings import Settings

    s = Settings(llm_provider="openai", openai_api_key="sk-test")  # type: ignore[arg-type]  # pydantic makes the str a SecretStr
    model, extractor = build_models(s)
    assert isinstance(model, OpenAISummaryModel)
    client = model._client
    assert client.max_retries == 1 and client.timeout == 20.0
    assert s.model_call_budget_s() == 42.0  # 2 attempts x 20 s + backoff
    assert s.flush_timeout_s + s.model_call_budget_s() + 10 <= s.summary_lock_ttl_s
    with pytest.raises(ValidationError) as e:
        Settings(openai_timeout_s=120, openai_max_retries=2)
    assert "summary_lock_ttl_s" in str(e.value)
