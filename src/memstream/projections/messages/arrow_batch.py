"""The projector's bulk parse in Arrow: raw journal records -> the rows of ``journal_batch_sql``.

Pure (bytes in, an Arrow table out, no I/O). pyarrow's C++ JSON reader parses a batch of
newline-joined envelopes against an explicit schema (the envelope fields the projector reads;
unknown fields ignored), and :mod:`pyarrow.compute` classifies and maps them with the rules
of :func:`~memstream.projections.messages.sql.journal_batch_sql`, which mirror
:func:`~memstream.schemas.events.decode` and
:func:`~memstream.projections.messages.rows.row_of_envelope`. It replaced ClickHouse's
``JSONEachRow`` parse of the batch, which cost as much as the insert it fed
(docs/transcript-search.md, "Projector throughput").

Guarantees:

- :func:`parse_journal_values` returns None -- the caller then decodes in Python, which
  names the bad record -- whenever it cannot vouch that every record reads exactly as the
  Python decoder reads it: JSON the reader rejects (a value of the wrong JSON type for a
  field it reads, a repeated field, a bad escape or surrogate), bytes that are not UTF-8
  (orjson rejects them even in a field nobody reads), a ``NaN``/``Infinity`` token (which
  the C++ reader accepts and orjson does not), a record that is not one ``{...}`` object, or
  a row count that differs from the record count.
- Otherwise every record gets a ``kind`` (``KIND_*`` of :mod:`.sql`), and a record is
  ``KIND_ROW`` or ``KIND_POSITION`` only in the canonical form ``Message.to_dict`` writes
  (``v`` 1, a known type, ``data`` an object, ids equal to the envelope's, a non-negative
  offset, a ``seq`` present and non-negative, tool calls with string ids, ``created_at`` as
  ``YYYY-MM-DDTHH:MM:SS.mmmZ`` naming a real instant). Anything else is ``KIND_PYTHON``.
- For such a batch, :func:`~.rows.split_journal_batch` of the result gives exactly the rows
  of ``rows_of_batch`` and the positions of ``thread_positions`` on the decoded envelopes
  (property-tested in ``tests/unit/test_arrow_batch.py``).
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from memstream.projections.messages.rows import MESSAGES_SCHEMA
from memstream.projections.messages.sql import KIND_OTHER, KIND_POSITION, KIND_PYTHON, KIND_ROW
from memstream.schemas.events import ENVELOPE_VERSION, EVENT_TYPES

__all__ = ["ENVELOPE_SCHEMA", "parse_journal_values"]

_TOOL_CALL: Final = pa.struct([("id", pa.string())])
ENVELOPE_SCHEMA: Final = pa.schema(
    [
        ("v", pa.int64()),
        ("type", pa.string()),
        ("id", pa.string()),
        ("ts", pa.int64()),
        ("account_id", pa.string()),
        ("agent_id", pa.string()),
        ("thread_id", pa.string()),
        (
            "data",
            pa.struct(
                [
                    ("account_id", pa.string()),
                    ("agent_id", pa.string()),
                    ("thread_id", pa.string()),
                    ("offset", pa.int64()),
                    ("message_id", pa.string()),
                    ("seq", pa.int64()),
                    ("role", pa.string()),
                    ("content", pa.string()),
                    ("user_id", pa.string()),
                    ("tool_calls", pa.list_(_TOOL_CALL)),
                    ("created_at", pa.string()),
                ]
            ),
        ),
    ]
)
"""The envelope fields the projector reads, typed as the Python decoder requires them."""

_PARSE: Final = pj.ParseOptions(explicit_schema=ENVELOPE_SCHEMA, unexpected_field_behavior="ignore")
_READ_BLOCK: Final = 1 << 20
"""The reader parses blocks of this many bytes on its threads (a 5,000-event batch is ~2 MB)."""
_NON_FINITE: Final = re.compile(rb"[:,\[]\s*-?(?:NaN|Inf)")
"""A ``NaN``/``Infinity`` token (the C++ reader takes them, orjson does not). Inside a string
this is a false alarm, which only sends the batch to the Python path."""
_CREATED_AT: Final = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}[.][0-9]{3}Z$"
_TYPES: Final = pa.array(sorted(EVENT_TYPES), pa.string())
_SEARCHABLE: Final = pa.array(["user", "assistant"], pa.string())
_POSITION_ONLY: Final = pa.array(["system", "tool"], pa.string())
_EMPTY_CALLS: Final = pa.scalar([], pa.list_(_TOOL_CALL))


def parse_journal_values(values: Sequence[bytes], *, event_id: bool = False) -> pa.Table | None:
    """``kind`` then the :data:`~.rows.MESSAGES_SCHEMA` columns (then ``event_id``, the
    envelope's ``id``, when asked), one row per record in order; None when the batch cannot
    be vouched for (see the module docstring). Columns of rows that are not ``KIND_ROW`` hold
    placeholders."""
    if not values or not all(v[:1] == b"{" and v[-1:] == b"}" for v in values):
        return None
    payload = b"\n".join(values)
    if not payload.isascii():
        try:
            payload.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if (b"NaN" in payload or b"Inf" in payload) and _NON_FINITE.search(payload):
        return None
    try:
        parsed = pj.read_json(
            io.BytesIO(payload),
            read_options=pj.ReadOptions(use_threads=True, block_size=_READ_BLOCK),
            parse_options=_PARSE,
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if parsed.num_rows != len(values):
        return None
    return _classify(parsed.combine_chunks(), event_id=event_id)


def _ok(mask: pa.Array) -> pa.Array:
    """A condition where null (a missing field) counts as false."""
    return pc.fill_null(mask, False)


def _classify(env: pa.Table, *, event_id: bool) -> pa.Table | None:
    n = env.num_rows
    col = {
        name: env.column(name).chunk(0) if env.num_rows else env.column(name).combine_chunks()
        for name in env.column_names
    }
    data = col["data"]
    d = {f.name: pc.struct_field(data, f.name) for f in data.type}  # null where data is null
    account, agent, thread = col["account_id"], col["agent_id"], col["thread_id"]
    seq, offset, role = d["seq"], d["offset"], d["role"]

    envelope_ok = _ok(
        pc.and_kleene(
            pc.and_kleene(pc.equal(col["v"], ENVELOPE_VERSION), pc.is_in(col["type"], _TYPES)),
            pc.and_kleene(
                pc.and_kleene(pc.is_valid(col["id"]), pc.is_valid(col["ts"])),
                pc.and_kleene(
                    pc.and_kleene(pc.is_valid(account), pc.is_valid(agent)), pc.is_valid(data)
                ),
            ),
        )
    )
    is_message = _ok(pc.equal(col["type"], "message.appended"))
    seq_ok = _ok(pc.greater_equal(seq, 0))  # present (Message.to_dict always writes it)

    # tool calls: each must carry an id (a null list is no calls, as in row_of_envelope)
    calls = pc.if_else(pc.is_null(d["tool_calls"]), _EMPTY_CALLS, d["tool_calls"])
    assert isinstance(calls, pa.ListArray)
    call_ids = pc.struct_field(calls.values, "id")
    missing = np.zeros(n, dtype=bool)
    if len(call_ids):
        parents = pc.list_parent_indices(calls).to_numpy()
        missing[parents[pc.is_null(call_ids).to_numpy(zero_copy_only=False)]] = True
    calls_ok = pa.array(~missing)
    tool_call_ids = pa.ListArray.from_arrays(calls.offsets, pc.fill_null(call_ids, ""))

    created = _created_at(d["created_at"])
    if created is None:
        return None
    created_ms, created_ok = created
    row_ok = _all(
        _ok(pc.is_in(role, _SEARCHABLE)),
        _ok(pc.equal(d["account_id"], account)),
        _ok(pc.equal(d["agent_id"], agent)),
        _ok(pc.equal(d["thread_id"], thread)),
        _ok(pc.greater_equal(offset, 0)),
        pc.is_valid(d["message_id"]),
        pc.is_valid(d["content"]),
        seq_ok,
        calls_ok,
        created_ok,
    )
    position_ok = pc.and_(_ok(pc.is_in(role, _POSITION_ONLY)), seq_ok)
    kind = pc.case_when(
        pc.make_struct(
            pc.invert(envelope_ok),
            pc.invert(is_message),
            position_ok,
            row_ok,
        ),
        pa.scalar(KIND_PYTHON, pa.uint8()),
        pa.scalar(KIND_OTHER, pa.uint8()),
        pa.scalar(KIND_POSITION, pa.uint8()),
        pa.scalar(KIND_ROW, pa.uint8()),
        pa.scalar(KIND_PYTHON, pa.uint8()),
    )
    columns = [
        kind,
        pc.fill_null(account, ""),
        pc.fill_null(agent, ""),
        pc.fill_null(thread, ""),
        _non_negative(offset),
        pc.fill_null(d["message_id"], ""),
        pc.fill_null(role, ""),
        pc.fill_null(d["content"], ""),
        pc.fill_null(d["user_id"], ""),
        tool_call_ids,
        created_ms,
        _non_negative(seq),
    ]
    names = ["kind", *MESSAGES_SCHEMA.names]
    if event_id:
        columns.append(pc.fill_null(col["id"], ""))
        names.append("event_id")
    return pa.Table.from_arrays(columns, names=names)


def _all(*masks: pa.Array) -> pa.Array:
    out = masks[0]
    for m in masks[1:]:
        out = pc.and_(out, m)
    return out


def _non_negative(values: pa.Array) -> pa.Array:
    return pc.cast(pc.max_element_wise(pc.fill_null(values, 0), 0), pa.uint64())


def _created_at(text: pa.Array) -> tuple[pa.Array, pa.Array] | None:
    """(the times as ``timestamp[ms, UTC]``, 0 where not canonical; whether each is
    canonical: ``YYYY-MM-DDTHH:MM:SS.mmmZ`` in years 1-9999). Arrow's ISO-8601 cast reads
    these exactly as ``datetime.fromisoformat`` does and rejects what it rejects (30
    February, hour 24, a leap second), but for a whole array at once: such a time raises
    ``ArrowInvalid``, and the batch goes to the Python path (None; tested)."""
    ok = pc.and_(
        _ok(pc.match_substring_regex(text, _CREATED_AT)),
        pc.invert(_ok(pc.starts_with(text, "0000"))),
    )
    canonical = pc.if_else(ok, text, "1970-01-01T00:00:00.000Z")
    try:
        return pc.cast(canonical, pa.timestamp("ms", tz="UTC")), ok
    except pa.ArrowInvalid:
        return None
