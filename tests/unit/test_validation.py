"""Pure validation of caller input: errors name the exact field; ``produce`` line parsing
and batching keep per-thread order."""

from __future__ import annotations

import pytest

from memstream.agents_ctx.validation import check_id, parse_append_body, parse_thread_body
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
    rows = [
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
