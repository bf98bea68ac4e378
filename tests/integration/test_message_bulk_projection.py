"""The message projector's bulk path (ClickHouse parses raw journal records) against chdb.

Covers: a canonical batch is projected in bulk with the same searchable rows, privacy and
read-your-writes positions as the Python path; a batch with a record the bulk path cannot
vouch for writes nothing in bulk, falls back to Python, and only the bad record fails on its
own; the gate passes raw records through and records the projector's reported positions.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import orjson
import pytest

from memstream.projections.messages import MessageStore, SearchSpec, query_words
from memstream.projections.positions import Watermarks
from memstream.projections.replay import Gate
from memstream.schemas.events import DecodeError, encode, message_appended, thread_event
from memstream.schemas.records import Message, Role, ThreadRef
from memstream.streams.gate import GatedProcessor, record_messages
from memstream.streams.message_projector import MessageProjector
from memstream.streams.processor import EventMeta, RawRecord

pytestmark = pytest.mark.asyncio(loop_scope="session")

T = datetime(2026, 3, 1, tzinfo=UTC)


def msg(acct: str, thread: str, offset: int, role: Role, content: str, **kw: object) -> Message:
    return Message(
        account_id=acct,
        agent_id="ag",
        thread_id=thread,
        offset=offset,
        message_id=f"{acct}-{thread}-{offset}",
        role=role,
        content=content,
        created_at=T + timedelta(seconds=offset),
        seq=100 + offset,
        **kw,  # type: ignore[arg-type]  # Message's other fields, as each test gives them
    )


def raw(values: Sequence[bytes]) -> list[RawRecord]:
    return [RawRecord(EventMeta("journal", 0, i, b"k"), v) for i, v in enumerate(values)]


def enc(m: Message) -> bytes:
    return encode(message_appended(m, ts=1))


async def found(store: MessageStore, acct: str, q: str, user: str | None = None) -> list[str]:
    hits = await store.search(SearchSpec(acct, "ag", user, query_words(q), 50))
    return sorted(f"{h.thread_id}:{h.offset}:{h.role}:{h.content}" for h in hits)


async def test_a_canonical_batch_projects_in_bulk_like_the_python_path(
    message_store: MessageStore,
) -> None:
    acct = f"a{uuid.uuid4().hex[:8]}"
    msgs = [
        msg(acct, "t1", 0, "system", "walrus system prompt"),
        msg(acct, "t1", 1, "user", "Walrus tusks?", user_id="u1"),
        msg(acct, "t1", 2, "assistant", "walrus tusks grow", reasoning="walrus secret"),
        msg(acct, "t1", 3, "tool", "walrus tool output", tool_call_id="c1"),
        msg(acct, "t2", 0, "user", "Grüße walrus ü"),
        msg(acct, "t2", 7, "tool", "later tool"),
    ]
    values = [enc(m) for m in msgs] + [
        encode(thread_event("thread.created", acct, "ag", "t3", ts=1)),
        enc(msgs[1]),  # a redelivery inside the batch
    ]
    projector = MessageProjector(message_store, bulk_min=2)
    await projector.handle_raw(raw(values))

    assert projector.bulk_batches == 1 and projector.python_batches == 0
    assert projector.rows_written == 3
    # private thread t1 (u1 wrote in it): only u1 sees it, including the assistant reply
    assert await found(message_store, acct, "walrus", "u1") == [
        f"t1:1:user:{msgs[1].content}",
        f"t1:2:assistant:{msgs[2].content}",
        f"t2:0:user:{msgs[4].content}",
    ]
    assert await found(message_store, acct, "walrus") == [f"t2:0:user:{msgs[4].content}"]
    assert await found(message_store, acct, "secret", "u1") == []
    assert await found(message_store, acct, "grüße") == [f"t2:0:user:{msgs[4].content}"]
    # positions cover every message.appended, whatever its role
    assert dict(projector.applied_positions()) == {
        ThreadRef(acct, "ag", "t1").key: 103,
        ThreadRef(acct, "ag", "t2").key: 107,
    }
    assert await message_store.thread_row_counts(acct, "ag", "t1") == (2, 2)


def _variant(m: Message, **data: object) -> bytes:
    env = orjson.loads(enc(m))
    env["data"].update(data)
    return orjson.dumps(env)


@pytest.mark.parametrize(
    "bad",
    [
        b"{not json",
        b'{"v":1}{"v":1}',
        "offset_as_float",
        "unknown_role",
        "foreign_account",
        "data_null",
        "tool_call_without_id",
    ],
)
async def test_a_record_the_bulk_path_cannot_vouch_for_falls_back_to_python(
    message_store: MessageStore, bad: bytes | str
) -> None:
    acct = f"a{uuid.uuid4().hex[:8]}"
    good = msg(acct, "t1", 0, "user", "narwhal horn")
    if isinstance(bad, str):
        m = msg(acct, "t1", 1, "user", "narwhal bad")
        variants: dict[str, bytes] = {
            "offset_as_float": _variant(m, offset=1.5),
            "unknown_role": _variant(m, role="robot"),
            "foreign_account": _variant(m, account_id="other"),
            "tool_call_without_id": _variant(m, tool_calls=[{"name": "x"}]),
            "data_null": orjson.dumps({**orjson.loads(enc(m)), "data": None}),
        }
        bad = variants[bad]
    assert await message_store.write_journal_batch([enc(good), bad]) is None
    assert await found(message_store, acct, "narwhal") == []  # nothing written in bulk

    projector = MessageProjector(message_store, bulk_min=2)
    with pytest.raises(DecodeError):
        await projector.handle_raw(raw([enc(good), bad]))
    # the runtime then isolates records one by one: the good one projects, the bad one fails
    await projector.handle_raw(raw([enc(good)]))
    with pytest.raises(DecodeError):
        await projector.handle_raw(raw([bad]))
    assert await found(message_store, acct, "narwhal") == ["t1:0:user:narwhal horn"]


async def test_non_canonical_but_valid_records_are_projected_by_the_python_path(
    message_store: MessageStore,
) -> None:
    acct = f"a{uuid.uuid4().hex[:8]}"
    m = msg(acct, "t1", 0, "user", "beluga song")
    offset_time = _variant(m, created_at="2026-03-01T01:00:00+01:00")
    projector = MessageProjector(message_store, bulk_min=2)
    await projector.handle_raw(raw([offset_time, enc(msg(acct, "t1", 1, "user", "beluga"))]))
    assert projector.python_batches == 1 and projector.bulk_batches == 0
    hits = await message_store.search(SearchSpec(acct, "ag", None, query_words("beluga"), 5))
    assert {h.offset: h.created_at for h in hits}[0] == T


async def test_the_gate_passes_raw_records_and_records_reported_positions(
    message_store: MessageStore,
) -> None:
    acct = f"a{uuid.uuid4().hex[:8]}"
    marks = Watermarks("transcript search")
    gated = GatedProcessor(
        MessageProjector(message_store, bulk_min=2), Gate(), record_messages(marks)
    )
    assert gated.raw
    await gated.handle_raw(
        raw([enc(msg(acct, "t1", 0, "user", "orca")), enc(msg(acct, "t1", 4, "system", "s"))])
    )
    assert marks.get(ThreadRef(acct, "ag", "t1").key) == 104
    assert await found(message_store, acct, "orca") == ["t1:0:user:orca"]


async def test_a_batch_below_bulk_min_is_projected_by_the_python_path_alike(
    message_store: MessageStore,
) -> None:
    acct = f"a{uuid.uuid4().hex[:8]}"
    msgs = [
        msg(acct, "t1", 0, "system", "dugong system prompt"),
        msg(acct, "t1", 1, "user", "Dugong grass?", user_id="u1"),
        msg(acct, "t2", 0, "user", "dugong seas"),
    ]
    projector = MessageProjector(message_store, bulk_min=10)
    await projector.handle_raw(raw([enc(m) for m in msgs] + [enc(msgs[2])]))
    assert projector.python_batches == 1 and projector.bulk_batches == 0
    assert projector.rows_written == 2
    assert await found(message_store, acct, "dugong", "u1") == [
        f"t1:1:user:{msgs[1].content}",
        f"t2:0:user:{msgs[2].content}",
    ]
    assert await found(message_store, acct, "dugong") == [f"t2:0:user:{msgs[2].content}"]
    assert dict(projector.applied_positions()) == {
        ThreadRef(acct, "ag", "t1").key: msgs[1].seq,
        ThreadRef(acct, "ag", "t2").key: msgs[2].seq,
    }
