"""Messages in the shapes model APIs use: OpenAI Chat Completions in and out, the Anthropic
Messages rendering, and tool calls paired with their results in every window. Checked
against the ``openai`` and ``anthropic`` packages' own request types and pairing rules."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstream.agents_ctx.context import Context, ContextMessage, assemble, window_message
from memstream.agents_ctx.message_shapes import (
    anthropic_messages,
    anthropic_tool_id,
    check_format,
    openai_message,
)
from memstream.agents_ctx.validation import parse_append_body
from memstream.errors import InvalidRequest
from memstream.schemas.records import Message, NewMessage, ToolCall
from tests.shapes import (
    anthropic_errors,
    anthropic_linkage_errors,
    openai_errors,
    openai_linkage_errors,
)

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
    assert assemble([], None, [], window_limit=4).messages == ()


def _msg(role: str, content: str = "", calls: tuple[str, ...] = (), answers: str | None = None
         ) -> ContextMessage:  # fmt: skip
    return ContextMessage(role, content, tuple(ToolCall(c, "f", {}) for c in calls), answers)  # type: ignore[arg-type]  # role from the test's literals


def _both_apis_accept(ctx: Context) -> None:
    openai = ctx.to_dict()["messages"]
    anthropic = ctx.to_dict("anthropic")["messages"]
    assert openai_errors(openai) + openai_linkage_errors(openai) == []  # type: ignore[arg-type]  # JSON lists
    assert anthropic_errors(anthropic) + anthropic_linkage_errors(anthropic) == []  # type: ignore[arg-type]  # JSON lists


def _assembled(window: list[ContextMessage]) -> Context:
    t = datetime(2026, 1, 1, tzinfo=UTC)
    msgs = [Message("a", "g", "t", i, f"m{i}", m.role, m.content, t, 0, i + 1, None,
                    m.tool_calls, m.tool_call_id) for i, m in enumerate(window)]  # fmt: skip
    return assemble([], None, msgs)


def test_a_user_message_sent_while_a_tool_ran_goes_after_the_results() -> None:
    ctx = _assembled([
        _msg("user", "book a table and check the weather"),
        _msg("assistant", "", ("a", "b")),
        _msg("tool", "booked", answers="a"),
        _msg("user", "for four people"),
        _msg("tool", "sunny", answers="b"),
        _msg("assistant", "Booked for four; sunny."),
    ])  # fmt: skip
    assert [(m.role, m.content) for m in ctx.messages] == [
        ("user", "book a table and check the weather"),
        ("assistant", ""),
        ("tool", "booked"),
        ("tool", "sunny"),
        ("user", "for four people"),
        ("assistant", "Booked for four; sunny."),
    ]
    _both_apis_accept(ctx)
    turns: Any = ctx.to_dict("anthropic")["messages"]  # JSON, navigated by the test
    assert [b["type"] for b in turns[2]["content"]] == ["tool_result", "tool_result", "text"]


def test_a_call_never_answered_is_left_out_and_its_text_kept() -> None:
    ctx = _assembled([
        _msg("user", "what is on my calendar?"),
        _msg("assistant", "", ("lost",)),  # the runtime crashed before the result
        _msg("user", "hello?"),
        _msg("assistant", "Let me check both.", ("a", "b")),
        _msg("tool", "10:00 dentist", answers="a"),  # b never answered
        _msg("assistant", "A dentist at 10."),
    ])  # fmt: skip
    assert [(m.role, m.content, [c.id for c in m.tool_calls]) for m in ctx.messages] == [
        ("user", "what is on my calendar?", []),
        ("user", "hello?", []),
        ("assistant", "Let me check both.", ["a"]),
        ("tool", "10:00 dentist", []),
        ("assistant", "A dentist at 10.", []),
    ]
    _both_apis_accept(ctx)


def test_a_second_result_for_one_call_and_a_result_before_its_call_are_dropped() -> None:
    ctx = _assembled([
        _msg("tool", "early", answers="x"),
        _msg("assistant", "", ("x",)),
        _msg("tool", "first", answers="x"),
        _msg("tool", "retried", answers="x"),
        _msg("assistant", "", ("x",)),  # the same id called again: its result is used up
        _msg("assistant", "done"),
    ])  # fmt: skip
    assert [(m.role, m.content) for m in ctx.messages] == [
        ("assistant", ""),
        ("tool", "first"),
        ("assistant", "done"),
    ]
    _both_apis_accept(ctx)


_ROLES = st.sampled_from(["user", "assistant", "tool", "system"])


@st.composite
def _windows(draw: st.DrawFn) -> list[ContextMessage]:
    ids = st.sampled_from(["a", "b", "functions.search:0", "c 1", "ça"])
    out = []
    for _ in range(draw(st.integers(0, 14))):
        role = draw(_ROLES)
        text = draw(st.sampled_from(["", " \n", "hi"]))
        if role == "assistant":
            out.append(_msg(role, text, tuple(draw(st.lists(ids, max_size=3)))))
        elif role == "tool":
            out.append(_msg(role, text, answers=draw(ids)))
        else:
            out.append(_msg(role, text.strip() or "hi"))
    return out


@settings(max_examples=200, deadline=None)
@given(_windows())
def test_every_window_is_one_both_apis_accept(window: list[ContextMessage]) -> None:
    """Whatever order calls and results were appended in, the context is accepted by both
    APIs, and it is made only of what was appended (nothing added, each message once)."""
    ctx = _assembled(window)
    _both_apis_accept(ctx)
    kept = list(ctx.messages)
    assert len(kept) <= len(window)
    originals = {(m.role, m.content, m.tool_call_id) for m in window}
    assert all((m.role, m.content, m.tool_call_id) in originals for m in kept)
    results = [m.tool_call_id for m in kept if m.role == "tool"]
    assert len(results) == len(set(results))


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


def test_anthropic_gets_ids_it_accepts_and_no_blank_text() -> None:
    """Ids such as ``functions.search:0`` (some providers emit them) and whitespace beside a
    tool call (models return ``"\\n\\n"``) were passed through, and Anthropic answers 400."""
    ctx = _assembled([
        _msg("user", "find it"),
        _msg("assistant", "\n\n", ("functions.search:0", "functions.search:1")),
        _msg("tool", "found", answers="functions.search:0"),
        _msg("tool", " ", answers="functions.search:1"),
        _msg("assistant", "Here it is."),
    ])  # fmt: skip
    _both_apis_accept(ctx)
    turns: Any = ctx.to_dict("anthropic")["messages"]  # JSON, navigated by the test
    uses = [b["id"] for b in turns[1]["content"]]
    assert [b["type"] for b in turns[1]["content"]] == ["tool_use", "tool_use"]
    assert [b["tool_use_id"] for b in turns[2]["content"]] == uses and len(set(uses)) == 2
    assert uses[0].startswith("functions_search_0_") and "content" not in turns[2]["content"][1]
    assert anthropic_tool_id("call_Ab-9") == "call_Ab-9"  # a valid id is kept
    openai: Any = ctx.to_dict()["messages"]  # OpenAI takes any id: verbatim there
    assert openai[1]["tool_calls"][0]["id"] == "functions.search:0"


def test_format_names_the_parameter() -> None:
    assert check_format(None) == "openai"
    assert check_format("anthropic") == "anthropic"
    with pytest.raises(InvalidRequest) as e:
        check_format("gemini")
    assert e.value.field == "format"
