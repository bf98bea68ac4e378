"""Validation of journal_message_search arguments: every error names its field."""

from __future__ import annotations

import pytest

from memstream.agents_ctx.journal_tools import build_search_spec
from memstream.errors import InvalidRequest
from memstream.schemas.records import Caller

CALLER = Caller("acc", "ag", "alice")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"query": ""}, "query"),
        ({"query": "   "}, "query"),
        ({"query": "!!!"}, "query"),
        ({"query": 42}, "query"),
        ({"query": "x", "limit": 0}, "limit"),
        ({"query": "x", "limit": 51}, "limit"),
        ({"query": "x", "limit": "10"}, "limit"),
        ({"query": "x", "limit": True}, "limit"),
        ({"query": "x", "scope": "everything"}, "scope"),
        ({"query": "x", "scope": "current_thread"}, "thread_id"),
        ({"query": "x", "scope": "current_thread", "thread_id": ""}, "thread_id"),
        ({"query": "x", "thread_id": 5}, "thread_id"),
    ],
)
def test_bad_arguments_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        build_search_spec(CALLER, **kwargs)
    assert e.value.field == field


def test_defaults_and_bounds() -> None:
    spec = build_search_spec(CALLER, "Blue Car")
    # The words are analysed: stemmed like the terms column.
    assert spec.limit == 10 and spec.thread_id is None and spec.words == ("blu", "car")
    assert spec.account_id == "acc" and spec.agent_id == "ag" and spec.user_id == "alice"
    assert build_search_spec(CALLER, "x", limit=1).limit == 1
    assert build_search_spec(CALLER, "x", limit=50).limit == 50


def test_current_thread_scopes_and_all_threads_ignores_thread_id() -> None:
    assert build_search_spec(CALLER, "x", "current_thread", "t1").thread_id == "t1"
    assert build_search_spec(CALLER, "x", "all_threads", "t1").thread_id is None
