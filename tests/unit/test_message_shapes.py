"""Messages in the shapes model APIs use: OpenAI Chat Completions in and out, the Anthropic
Messages rendering, and the window edge (no leading orphan tool results). Checked against
the ``openai`` and ``anthropic`` packages' own request types."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from memstream.agents_ctx.context import Context, ContextMessage, assemble, window_message
from memstream.agents_ctx.message_shapes import (
    anthropic_messages,
    check_format,
    drop_leading_orphans,
    openai_message,
)
from memstream.agents_ctx.validation import parse_append_body
from memstream.errors import InvalidRequest
from memstream.schemas.records import Message, NewMessage, ToolCall
from tests.shapes import anthropic_errors, openai_errors

# A conversation exactly as an OpenAI agent loop holds it.
OPENAI_TURN: list[dict[str, object]] = [
    {"role": "system", "content": "You are terse."},
    {
        "role": "user",
        "content": [{"type": "text", "text": "weather in"}, {"type": "text", "text": "Oslo?"}],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
            },
            {"id": "call_2", "type": "function", "function": {"name": "time", "arguments": "{}"}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "4C, rain"},
    {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "09:00"}]},
    {"role": "assistant", "content": "4C and rain at 09:00."},
]


def as_messages(new: list[NewMessage]) -> list[Message]:
    t = datetime(2026, 1, 1, tzinfo=UTC)
    return [
        Message("a", "g", "t", i, f"m{i}", m.role, m.content, t, 0, i + 1, m.reasoning,
                m.tool_calls, m.tool_call_id)
        for i, m in enumerate(new)
    ]  # fmt: skip


def test_openai_messages_are_accepted_verbatim() -> None:
    parsed = parse_append_body({"messages": OPENAI_TURN}, None)
    assert [m.role for m in parsed] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert parsed[1].content == "weather in\nOslo?"
    assert parsed[2].content == ""
    assert parsed[2].tool_calls == (
        ToolCall("call_1", "weather", '{"city": "Oslo"}'),
        ToolCall("call_2", "time", "{}"),
    )
    assert parsed[4].content == "09:00"


def test_the_flat_shape_is_the_same_record() -> None:
    flat = parse_append_body(
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c", "name": "f", "arguments": "{}"}],
        },
        None,
    )
    nested = parse_append_body(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        None,
    )
    assert flat == nested


def test_developer_role_is_a_system_message() -> None:
    (m,) = parse_append_body({"role": "developer", "content": "be brief"}, None)
    assert m.role == "system"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"arguments": "{}"}}]},
         "tool_calls[0].function.name"),
        ({"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": "f"}]},
         "tool_calls[0].function"),
        ({"role": "assistant", "tool_calls": [{"id": "c", "type": "custom", "function": {"name": "f"}}]},
         "tool_calls[0].type"),
        ({"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f"}}]},
         "tool_calls[0].id"),
        ({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}]},
         "content[1]"),
        ({"role": "user", "content": [{"type": "text", "text": 3}]}, "content[0].text"),
        ({"role": "user", "content": 7}, "content"),
        ({"role": "user", "content": [{"type": "text", "text": " "}]}, "content"),
    ],
)  # fmt: skip
def test_bad_openai_shapes_name_the_field(body: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        parse_append_body({"messages": [body]}, None)
    assert e.value.field == f"messages[0].{field}"


def test_openai_round_trip_is_what_was_sent() -> None:
    msgs = as_messages(parse_append_body({"messages": OPENAI_TURN}, None))
    out = [openai_message(window_message(m)) for m in msgs]
    assert openai_errors(out) == []
    # text parts come back as one string; everything else exactly as sent
    expected = [dict(m) for m in OPENAI_TURN]
    expected[1]["content"] = "weather in\nOslo?"
    expected[4]["content"] = "09:00"
    assert out == expected


def test_flat_arguments_come_out_as_json_text() -> None:
    m = ContextMessage("assistant", "", (ToolCall("c", "f", {"q": "x"}), ToolCall("d", "g", None)))
    out = openai_message(m)
    assert openai_errors([out]) == []
    calls: Any = out["tool_calls"]  # JSON, navigated by the test
    assert isinstance(calls, list)
    assert [c["function"]["arguments"] for c in calls] == ['{"q":"x"}', "{}"]


def test_leading_orphans_are_dropped_only_at_the_edge() -> None:
    msgs = as_messages(parse_append_body({"messages": OPENAI_TURN}, None))
    # a window of 3 starts inside the tool results: both results lost their call
    ctx = assemble([], None, msgs, window_limit=3)
    assert [m.role for m in ctx.messages] == ["assistant"]
    # a window of 4 starts with the call: nothing is dropped
    ctx = assemble([], None, msgs, window_limit=4)
    assert [m.role for m in ctx.messages] == ["assistant", "tool", "tool", "assistant"]
    assert openai_errors(ctx.to_dict()["messages"]) == []
    assert drop_leading_orphans([]) == []


def test_anthropic_rendering() -> None:
    msgs = as_messages(parse_append_body({"messages": OPENAI_TURN}, None))
    ctx = Context(
        (ContextMessage("system", "<remembered_facts>...</remembered_facts>"),)
        + tuple(window_message(m) for m in msgs),
        (),
        None,
        20,
    )
    out = ctx.to_dict("anthropic")
    assert out["system"] == "<remembered_facts>...</remembered_facts>\n\nYou are terse."
    turns = out["messages"]
    assert anthropic_errors(turns) == []
    assert turns == [
        {"role": "user", "content": [{"type": "text", "text": "weather in\nOslo?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Oslo"}},
                {"type": "tool_use", "id": "call_2", "name": "time", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "4C, rain"},
                {"type": "tool_result", "tool_use_id": "call_2", "content": "09:00"},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "4C and rain at 09:00."}]},
    ]


def test_anthropic_tool_input_is_always_an_object() -> None:
    calls = (ToolCall("a", "f", "not json"), ToolCall("b", "f", "[1, 2]"), ToolCall("c", "f", 5))
    _, turns = anthropic_messages([ContextMessage("assistant", "ok", calls)])
    blocks: Any = turns[0]["content"]  # JSON, navigated by the test
    assert anthropic_errors(turns) == []
    assert [b["input"] for b in blocks[1:]] == [
        {"arguments": "not json"},
        {"arguments": [1, 2]},
        {"arguments": 5},
    ]


def test_format_names_the_parameter() -> None:
    assert check_format(None) == "openai"
    assert check_format("anthropic") == "anthropic"
    with pytest.raises(InvalidRequest) as e:
        check_format("gemini")
    assert e.value.field == "format"
