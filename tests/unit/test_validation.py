"""Pure validation of caller input: errors name the exact field; ``produce`` line parsing
and batching keep per-thread order."""

from __future__ import annotations

import pytest

from memstream.agents_ctx.validation import (
    check_id,
    parse_append_body,
    parse_thread_body,
    query_int,
)
from memstream.errors import InvalidRequest
from memstream.infra.cli.produce import LineError, batches, parse_lines


def test_single_and_many() -> None:
    assert len(parse_append_body({"role": "user", "content": "x"}, "u")) == 1
    msgs = parse_append_body(
        {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
        None,
    )
    assert [m.role for m in msgs] == ["user", "assistant"]


def test_duplicate_tool_call_ids() -> None:
    body = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "a", "name": "x"}, {"id": "a", "name": "y"}],
    }
    with pytest.raises(InvalidRequest) as e:
        parse_append_body(body, None)
    assert e.value.field == "tool_calls"


@pytest.mark.parametrize("bad", ["", "a/b", "x" * 201, "tab\there", 5, None])
def test_ids(bad: object) -> None:
    with pytest.raises(InvalidRequest) as e:
        check_id(bad, "thread_id")
    assert e.value.field == "thread_id"


def test_thread_body() -> None:
    assert parse_thread_body(None) == (None, {})
    with pytest.raises(InvalidRequest) as e:
        parse_thread_body({"metadata": {"config": "x"}})
    assert e.value.field == "metadata.config"


def test_produce_lines_report_numbers_and_fields() -> None:
    lines = [
        '{"account_id": "a", "agent_id": "b", "thread_id": "t", "role": "user", "content": "1"}',
        "",
        '{"account_id": "a", "agent_id": "b", "thread_id": "t", "role": "user"}',
        '{"account_id": "a", "agent_id": "b/c", "thread_id": "t", "role": "user", "content": "x"}',
        "{oops",
    ]
    out = list(parse_lines(lines))
    errs = [item for _, item in out if isinstance(item, LineError)]
    assert [(e.line, e.field) for e in errs] == [(3, "content"), (4, "agent_id"), (5, None)]


def test_batches_keep_thread_order_and_split() -> None:
    rows: list[tuple[int, dict[str, object]]] = [
        (
            1,
            {"account_id": "a", "agent_id": "b", "thread_id": "t1", "role": "user", "content": "1"},
        ),
        (
            2,
            {"account_id": "a", "agent_id": "b", "thread_id": "t1", "role": "user", "content": "2"},
        ),
        (
            3,
            {"account_id": "a", "agent_id": "b", "thread_id": "t2", "role": "user", "content": "3"},
        ),
        (
            4,
            {"account_id": "a", "agent_id": "b", "thread_id": "t1", "role": "user", "content": "4"},
        ),
    ]
    got = [(b.thread_id, b.lines) for b in batches(rows)]
    assert got == [("t1", [1, 2]), ("t2", [3]), ("t1", [4])]
    assert all("account_id" not in m for b in batches(rows) for m in b.messages)


def test_a_message_too_big_for_the_bus_or_holding_nul_is_refused_naming_the_field() -> None:
    from memstream.infra.journal.writer import check_fits_the_bus
    from memstream.schemas.limits import MAX_BUS_RECORD_BYTES, MAX_MESSAGE_CONTENT_CHARS
    from memstream.schemas.records import NewMessage, ToolCall

    # within the character limit, but 4 bytes a character: it would never reach the bus
    emoji = "\U0001f600" * (MAX_MESSAGE_CONTENT_CHARS // 2)
    with pytest.raises(InvalidRequest) as e:
        check_fits_the_bus(NewMessage(role="user", content=emoji), "messages[0].content")
    assert e.value.field == "messages[0].content" and str(MAX_BUS_RECORD_BYTES) in e.value.message
    big_args = ToolCall(id="c1", name="f", arguments={"x": "y" * MAX_BUS_RECORD_BYTES})
    with pytest.raises(InvalidRequest):
        check_fits_the_bus(NewMessage(role="assistant", content="", tool_calls=(big_args,)), "c")
    with pytest.raises(InvalidRequest) as e:
        check_fits_the_bus(NewMessage(role="user", content="a\x00b"), "messages[1].content")
    assert e.value.field == "messages[1].content" and "NUL" in e.value.message
    with pytest.raises(InvalidRequest) as e:
        check_fits_the_bus(
            NewMessage(role="assistant", content="ok", reasoning="\x00"), "messages[2].content"
        )
    assert e.value.field == "messages[2].reasoning"
    check_fits_the_bus(NewMessage(role="user", content="x" * 900_000), "ok")  # fits


@pytest.mark.parametrize(
    "hostile",
    [".", "..", "\U0001f600" * 33, "é" * 65, "a\\b", "a/b", "a\x00b", "\ud800"],
    ids=["dot", "dotdot", "33-emoji", "65-e-acute", "backslash", "slash", "nul", "surrogate"],
)
def test_hostile_ids_are_refused_at_the_edge_naming_the_field(hostile: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        check_id(hostile, "thread_id")
    assert e.value.field == "thread_id"


def test_ids_up_to_the_byte_limit_are_accepted() -> None:
    from memstream.agents_ctx.validation import ID_MAX_BYTES

    for ok in ("t-1", "é" * (ID_MAX_BYTES // 2), "\U0001f600" * (ID_MAX_BYTES // 4), "...x"):
        assert check_id(ok, "thread_id") == ok


def test_object_store_keys_never_leave_their_prefix_or_exceed_a_name_limit() -> None:
    from memstream.infra.summary_store import SEGMENT_MAX_CHARS, key_segment, summary_path
    from memstream.schemas.records import ThreadRef

    for hostile in (".", "..", "../../etc", "~x", "é" * 64, "\U0001f600" * 32, "a/b"):
        seg = key_segment(hostile)
        assert "/" not in seg and not seg.startswith(".") and len(seg) <= SEGMENT_MAX_CHARS
        path = summary_path(ThreadRef("acct", "agent", hostile))
        assert path.startswith("accounts/acct/agents/agent/threads/")
        assert path.count("/") == 6 and "/../" not in path and "/./" not in path
    assert key_segment("plain-id") == "plain-id"  # existing keys unchanged
    assert key_segment("é" * 64) == key_segment("é" * 64) != key_segment("é" * 63)


def test_query_int_refuses_what_int_refuses() -> None:
    """``str.isdigit`` accepts superscript digits ("²") that ``int`` refuses: the console
    answered 500 for them. ``query_int`` names the parameter instead."""
    assert query_int(None, "offset", 0) == 0 and query_int("", "offset", 7) == 7
    assert query_int("12", "offset", 0) == 12
    for bad in ("²", "abc", "1.5", "9" * 5000):
        with pytest.raises(InvalidRequest) as e:
            query_int(bad, "offset", 0)
        assert e.value.field == "offset"
