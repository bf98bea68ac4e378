"""The pure event -> row mapping of the message projection, and query tokenization."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

from memstream.errors import InvalidRequest
from memstream.projections.messages import query_words, row_of_envelope
from memstream.projections.messages.rows import (
    arrow_ipc,
    messages_table,
    thread_users_table,
)
from memstream.projections.messages.sql import literal
from memstream.schemas.events import DecodeError, Envelope, message_appended, thread_event
from memstream.schemas.records import Message, Role, ToolCall
from memstream.streams.message_projector import rows_of_batch

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def msg(offset: int, role: Role, content: str, **kw: object) -> Message:
    return Message(
        account_id="acc",
        agent_id="ag",
        thread_id="th",
        offset=offset,
        message_id=f"m{offset}",
        role=role,
        content=content,
        created_at=T0,
        **kw,  # type: ignore[arg-type]  # Message's other fields, as each test gives them
    )


def env(m: Message) -> Envelope:
    return message_appended(m, ts=1)


def test_user_and_assistant_become_rows_without_reasoning() -> None:
    u = row_of_envelope(env(msg(0, "user", "hello there", user_id="alice")))
    a = row_of_envelope(
        env(
            msg(
                1,
                "assistant",
                "calling a tool",
                reasoning="SECRET CHAIN OF THOUGHT",
                tool_calls=(ToolCall("tc-1", "lookup", {"q": "x"}),),
            )
        )
    )
    assert u is not None and u.content == "hello there" and u.user_id == "alice"
    assert a is not None and a.content == "calling a tool" and a.tool_call_ids == ("tc-1",)
    # the reasoning text is nowhere in the row
    assert "SECRET" not in repr(a)


@pytest.mark.parametrize("role", ["system", "tool"])
def test_system_and_tool_messages_map_to_nothing(role: Role) -> None:
    extra = {"tool_call_id": "tc-1"} if role == "tool" else {}
    assert row_of_envelope(env(msg(0, role, "you are a helpful bot", **extra))) is None


def test_other_events_map_to_nothing() -> None:
    assert row_of_envelope(thread_event("thread.created", "acc", "ag", "th", ts=1)) is None


def test_unreadable_message_names_the_field() -> None:
    bad = Envelope(
        type="message.appended",
        id="x",
        ts=1,
        account_id="acc",
        agent_id="ag",
        thread_id="th",
        data={"role": "user"},
    )
    with pytest.raises(DecodeError) as e:
        row_of_envelope(bad)
    assert e.value.field is not None and e.value.field.startswith("data.")


def test_envelope_tenancy_must_match_message() -> None:
    good = env(msg(0, "user", "hi"))
    forged = Envelope(
        type=good.type,
        id=good.id,
        ts=1,
        account_id="other",
        agent_id="ag",
        thread_id="th",
        data=good.data,
    )
    with pytest.raises(DecodeError):
        row_of_envelope(forged)


def test_batch_dedupes_redelivered_messages_and_keeps_order() -> None:
    events = [env(msg(0, "user", "a")), env(msg(1, "system", "s")), env(msg(2, "assistant", "b"))]
    rows = rows_of_batch(events + events)
    assert [r.offset for r in rows] == [0, 2]


def test_arrow_tables_round_trip() -> None:
    rows = rows_of_batch(
        [env(msg(0, "user", "héllo", user_id="u1")), env(msg(1, "assistant", "ok"))]
    )
    t = messages_table(rows)
    back = pa.ipc.open_stream(arrow_ipc(t)).read_all()
    assert back.column("content").to_pylist() == ["héllo", "ok"]
    assert back.column("offset").to_pylist() == [0, 1]
    assert thread_users_table(rows).to_pylist() == [
        {"account_id": "acc", "agent_id": "ag", "thread_id": "th", "user_id": "u1"}
    ]
    assert thread_users_table(rows[1:]).num_rows == 0


@pytest.mark.parametrize(
    ("query", "words"),
    [
        # split like splitByNonAlpha, lowercased, stemmed, stop words dropped
        ("Blue CAR", ("blu", "car")),
        ("  it's a blue-car, blue! ", ("blu", "car")),
        ("it is", ("it", "is")),  # only stop words: every word counts
        ("Grüße ÜBER", ("grüße", "über")),
        ("x_y 42", ("x", "y", "42")),
        ("?!...", ()),
    ],
)
def test_query_words_are_analysed_like_the_terms_column(query: str, words: tuple[str, ...]) -> None:
    assert query_words(query) == words


def test_literal_quotes_arrays() -> None:
    assert literal(["a", "it's", "b\\c"]) == "['a','it\\'s','b\\\\c']"
    assert literal(7) == "7"
    with pytest.raises(InvalidRequest):
        from memstream.projections.messages.sql import check_database

        check_database("x; DROP TABLE y")
