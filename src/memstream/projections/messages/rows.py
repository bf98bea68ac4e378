"""What the ClickHouse message table holds, and the pure mapping from journal events to rows.

Guarantees:

- Only ``user`` and ``assistant`` messages become rows. ``system`` and ``tool`` messages map
  to nothing, and a message's ``reasoning`` is never copied anywhere: text that must never be
  searchable is never stored, so no query (present or future) can return it.
- An assistant row keeps the ids of the tool calls it made (``tool_call_ids``), never their
  arguments or results: those are read from the journal by id (``journal_tool_call_view``).
- The mapping is deterministic: the same event always gives the same row, so a replay or a
  redelivery inserts an identical row under the same key ``(account_id, agent_id, thread_id,
  offset)``, which the table's ``ReplacingMergeTree`` collapses and the search query dedupes.
- Events that are not ``message.appended`` map to nothing; a ``message.appended`` whose data
  cannot be read raises :class:`~memstream.schemas.events.DecodeError` (naming the field) so
  the processor can dead-letter it.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from memstream.errors import InvalidRequest
from memstream.schemas.events import DecodeError, Envelope
from memstream.schemas.records import ROLES, Message, ThreadRef, parse_time

SEARCHABLE_ROLES: Final = frozenset({"user", "assistant"})
"""The only roles whose text is projected (the spec: user and assistant messages only)."""


@dataclass(frozen=True, slots=True)
class MessageRow:
    """One row of the ``messages`` table: a user or assistant message, without reasoning.

    ``user_id`` is ``""`` when the message carries no authenticated user.
    """

    account_id: str
    agent_id: str
    thread_id: str
    offset: int
    message_id: str
    role: str
    content: str
    user_id: str
    tool_call_ids: tuple[str, ...]
    created_at: datetime
    seq: int


def row_of_message(msg: Message) -> MessageRow | None:
    """The row for one journal message, or None when the message is never searchable."""
    if msg.role not in SEARCHABLE_ROLES:
        return None
    return MessageRow(
        account_id=msg.account_id,
        agent_id=msg.agent_id,
        thread_id=msg.thread_id,
        offset=msg.offset,
        message_id=msg.message_id,
        role=msg.role,
        content=msg.content,
        user_id=msg.user_id or "",
        tool_call_ids=tuple(tc.id for tc in msg.tool_calls),
        created_at=msg.created_at,
        seq=msg.seq,
    )


def _bad(what: str, field: str) -> DecodeError:
    return DecodeError(f"message.appended: {what}", field=f"data.{field}")


def row_of_envelope(env: Envelope) -> MessageRow | None:
    """Envelope -> row or nothing. Raises ``DecodeError`` (naming the field) on a user or
    assistant message it cannot read.

    Reads ``env.data`` directly instead of building a full :class:`Message` (the projector's
    hot path: ~4x cheaper), checking every field the row uses. Messages of other roles are
    dropped before their other fields are read: nothing of them is stored.
    """
    if env.type != "message.appended":
        return None
    d = env.data
    role = d.get("role")
    if not isinstance(role, str) or role not in SEARCHABLE_ROLES:
        if role not in ROLES:  # a tuple: an unhashable role (a list) compares, not raises
            raise _bad(f"role must be one of {', '.join(ROLES)}", "role")
        return None
    for name, expected in (
        ("account_id", env.account_id),
        ("agent_id", env.agent_id),
        ("thread_id", env.thread_id),
    ):
        if d.get(name) != expected:
            raise _bad(f"{name} must match the envelope's", name)
    offset, message_id, content = d.get("offset"), d.get("message_id"), d.get("content")
    if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise _bad("offset must be a non-negative integer", "offset")
    if not isinstance(message_id, str):
        raise _bad("message_id must be a string", "message_id")
    if not isinstance(content, str):
        raise _bad("content must be a string", "content")
    user_id = d.get("user_id")
    if user_id is not None and not isinstance(user_id, str):
        raise _bad("user_id must be a string or null", "user_id")
    seq = d.get("seq") or 0
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise _bad("seq must be a non-negative integer", "seq")
    raw_calls = d.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise _bad("tool_calls must be a list", "tool_calls")
    call_ids = []
    for i, tc in enumerate(raw_calls):
        tcid = tc.get("id") if isinstance(tc, dict) else None
        if not isinstance(tcid, str):
            raise _bad("tool call id must be a string", f"tool_calls[{i}].id")
        call_ids.append(tcid)
    try:
        created_at = parse_time(d.get("created_at"), "created_at")
    except InvalidRequest as e:
        raise _bad(e.message, "created_at") from None
    return MessageRow(
        account_id=env.account_id,
        agent_id=env.agent_id,
        thread_id=_thread_of(env),
        offset=offset,
        message_id=message_id,
        role=role,
        content=content,
        user_id=user_id or "",
        tool_call_ids=tuple(call_ids),
        created_at=created_at,
        seq=seq,
    )


def _thread_of(env: Envelope) -> str:
    if env.thread_id is None:  # already checked equal to data.thread_id: both missing
        raise _bad("thread_id must be a string", "thread_id")
    return env.thread_id


# --- Arrow encoding (the fastest chdb insert path) -------------------------------------------
MESSAGES_SCHEMA: Final = pa.schema(
    [
        ("account_id", pa.string()),
        ("agent_id", pa.string()),
        ("thread_id", pa.string()),
        ("offset", pa.uint64()),
        ("message_id", pa.string()),
        ("role", pa.string()),
        ("content", pa.string()),
        ("user_id", pa.string()),
        ("tool_call_ids", pa.list_(pa.string())),
        ("created_at", pa.timestamp("ms", tz="UTC")),
        ("seq", pa.uint64()),
    ]
)

THREAD_USERS_SCHEMA: Final = pa.schema(
    [
        ("account_id", pa.string()),
        ("agent_id", pa.string()),
        ("thread_id", pa.string()),
        ("user_id", pa.string()),
    ]
)


_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_MS: Final = timedelta(milliseconds=1)


def epoch_ms_exact(t: datetime) -> int:
    """Milliseconds since the epoch, exact (no float rounding); naive times are UTC."""
    if t.tzinfo is None:
        t = t.replace(tzinfo=UTC)
    return (t - _EPOCH) // _MS


def messages_table(rows: Sequence[MessageRow]) -> pa.Table:
    """The rows as an Arrow table in :data:`MESSAGES_SCHEMA` column order."""
    return pa.table(
        [
            [r.account_id for r in rows],
            [r.agent_id for r in rows],
            [r.thread_id for r in rows],
            pa.array([r.offset for r in rows], pa.uint64()),
            [r.message_id for r in rows],
            [r.role for r in rows],
            [r.content for r in rows],
            [r.user_id for r in rows],
            pa.array([list(r.tool_call_ids) for r in rows], pa.list_(pa.string())),
            # epoch-ms ints: ~100x faster for Arrow than tz-aware datetime objects
            pa.array([epoch_ms_exact(r.created_at) for r in rows], pa.timestamp("ms", tz="UTC")),
            pa.array([r.seq for r in rows], pa.uint64()),
        ],
        schema=MESSAGES_SCHEMA,
    )


def thread_users_table(rows: Sequence[MessageRow]) -> pa.Table:
    """One row per distinct (account, agent, thread, user) among rows that carry a user."""
    seen = sorted({(r.account_id, r.agent_id, r.thread_id, r.user_id) for r in rows if r.user_id})
    cols = list(zip(*seen, strict=True)) if seen else [(), (), (), ()]
    return pa.table([list(c) for c in cols], schema=THREAD_USERS_SCHEMA)


def arrow_ipc(table: pa.Table) -> bytes:
    """Arrow IPC stream bytes (ClickHouse's ``ArrowStream`` input format)."""
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


# --- The bulk path: rows parsed by ClickHouse (see sql.journal_batch_sql) ---------------------
_KEY_COLUMNS: Final = ("account_id", "agent_id", "thread_id", "offset")
_KIND_POSITION: Final = 1
_KIND_ROW: Final = 2


@dataclass(frozen=True, slots=True)
class ParsedBatch:
    """What one batch of journal records projects to, computed column-wise.

    ``messages``: the rows (:data:`MESSAGES_SCHEMA`), one per key, the first in batch order
    (as :func:`memstream.streams.message_projector.rows_of_batch`); ``owners``: the distinct
    (account, agent, thread, user) of rows with a user (:data:`THREAD_USERS_SCHEMA`);
    ``positions``: per thread key (``account/agent/thread``) the highest journal seq among the
    batch's ``message.appended`` events of any role (the read-your-writes position).
    """

    messages: pa.Table
    owners: pa.Table
    positions: dict[str, int]


def split_journal_batch(parsed: pa.Table) -> ParsedBatch:
    """Split the result of ``journal_batch_sql`` (``kind`` then the messages columns).

    The caller has checked that no row is ``KIND_PYTHON`` and that there is one row per
    record.
    """
    kind = parsed.column("kind")
    data = parsed.drop_columns(["kind"])
    rows = data.filter(pc.equal(kind, _KIND_ROW))
    if rows.num_rows:
        order = pa.array(range(rows.num_rows), pa.int64())
        firsts = (
            rows.select(list(_KEY_COLUMNS))
            .append_column("__i", order)
            .group_by(list(_KEY_COLUMNS), use_threads=False)
            .aggregate([("__i", "min")])
        )
        if firsts.num_rows < rows.num_rows:  # the first row of each key, in batch order
            rows = rows.take(firsts.column("__i_min").combine_chunks().sort())
    messages = rows.cast(MESSAGES_SCHEMA)
    with_user = messages.filter(pc.not_equal(messages.column("user_id"), ""))
    owners = (
        with_user.select(list(THREAD_USERS_SCHEMA.names))
        .group_by(list(THREAD_USERS_SCHEMA.names), use_threads=False)
        .aggregate([])
        .select(list(THREAD_USERS_SCHEMA.names))
        .cast(THREAD_USERS_SCHEMA)
    )
    positioned = data.filter(
        pc.and_(pc.greater_equal(kind, _KIND_POSITION), pc.not_equal(data.column("thread_id"), ""))
    )
    positions: dict[str, int] = {}
    if positioned.num_rows:
        best = positioned.group_by(["account_id", "agent_id", "thread_id"]).aggregate(
            [("seq", "max")]
        )
        for a, g, t, seq in zip(
            best.column("account_id").to_pylist(),
            best.column("agent_id").to_pylist(),
            best.column("thread_id").to_pylist(),
            best.column("seq_max").to_pylist(),
            strict=True,
        ):
            positions[ThreadRef(a, g, t).key] = int(seq)
    return ParsedBatch(messages=messages, owners=owners, positions=positions)
