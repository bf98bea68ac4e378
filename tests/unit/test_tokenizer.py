"""The one tokenizer: cl100k_base counts, special-token text, message counting."""

from __future__ import annotations

from memstream.infra.tokenizer import count_message_tokens, count_tokens
from memstream.schemas.records import NewMessage, ToolCall


def test_counts_cl100k_tokens() -> None:
    assert count_tokens("") == 0
    assert count_tokens("hello world") == 2  # cl100k_base: "hello", " world"
    assert count_tokens("hello " * 100) > count_tokens("hello " * 10)


def test_special_token_text_is_plain_text() -> None:
    assert count_tokens("<|endoftext|>") > 1  # not the single special token, and no error


def test_message_counts_content_reasoning_and_tool_calls() -> None:
    plain = NewMessage(role="assistant", content="hello world")
    with_reasoning = NewMessage(role="assistant", content="hello world", reasoning="hello world")
    call = ToolCall(id="c1", name="search", arguments={"q": "hello world"})
    with_call = NewMessage(role="assistant", content="hello world", tool_calls=(call,))
    assert count_message_tokens(plain) == 2
    assert count_message_tokens(with_reasoning) == 4
    assert count_message_tokens(with_call) == 2 + count_tokens("search") + count_tokens(
        '{"q":"hello world"}'
    )
