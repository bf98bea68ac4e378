"""A rebuilt generation's vectors, carried over from the one it replaces (``replay messages``).

A replay rebuilds identical message rows, so their vectors need no embedding again: they are
copied from the old generation's ``message_vectors`` for every message the new generation
holds with the same text (:func:`~.sql.carry_vectors_sql`). With a vector index
(:mod:`.vector_index`) the copies must reach the new generation's shard too. A replay does
both twice (:class:`~memstream.projections.replay_sinks.MessagesSink`):

- **at its seal**, before the live projector's gate closes: the bulk, one ``INSERT ...
  SELECT`` (:func:`carry_all`), then the shard filled from the table
  (:meth:`~.store.MessageStore.ensure_vectors`: minutes at 1M, while the live projector
  goes on writing the old generation);
- **at its switch**, under the gate: only the rest (:func:`carry_missing`): the vectors the
  old generation gained since (the vector loop's, those of the hand-over's messages), read
  with their keys, upserted into the shard, then inserted into ``message_vectors`` (the
  vector loop's order: a shard holding more than the table is a step ahead, never behind).

Guarantees:

- **Idempotent.** Both copy only the (message, model) pairs the new generation lacks, one
  row each (a resumed seal, a retried switch: no duplicate row; a point's id is its key).
- **Erasure holds.** :func:`purge_erased` erases from the new generation every thread of
  the registry of erased threads that has rows there (erasure deletes from the current
  generation only; a thread copied before it was erased would otherwise come back with the
  switch), and the carries skip the registry's threads; the sink runs it before each carry.
"""

from __future__ import annotations

import logging
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc

from memstream.projections.messages.sql import (
    carried_vectors_sql,
    carry_vectors_sql,
    missing_vectors_sql,
    threads_present_sql,
)
from memstream.projections.messages.store import ERASE_CHUNK, MessageStore
from memstream.projections.messages.vector_index import VectorRow
from memstream.projections.messages.vectors import VECTORS_SCHEMA

__all__ = ["CARRY_CHUNK", "carry_all", "carry_missing", "purge_erased"]

log = logging.getLogger(__name__)

CARRY_CHUNK: Final = 5_000
"""Vectors read, upserted and inserted per step of :func:`carry_missing` (~8 MB at 384-d)."""


async def carry_all(target: MessageStore, old_database: str) -> None:
    """Copy every vector of ``old_database`` whose message ``target`` holds with the same
    text and that ``target`` lacks, in one statement (the index is not written: the caller
    fills it from the table)."""
    await target.engine.command(carry_vectors_sql(old_database, target.database))


async def carry_missing(target: MessageStore, old_database: str, model: str | None) -> int:
    """The vectors of ``old_database`` that ``target`` lacks and whose message it holds with
    the same text, :data:`CARRY_CHUNK` at a time: those of ``model`` upserted into
    ``target``'s vector index first (when it has one), then all inserted into its
    ``message_vectors``. Threads of the registry of erased threads are skipped. Returns the
    vectors carried."""
    old, new = old_database, target.database
    keys = await target.engine.rows(missing_vectors_sql(old, new), {})
    index = target.vector_index(model) if model is not None else None
    carried = 0
    for i in range(0, len(keys), CARRY_CHUNK):
        chunk = keys[i : i + CARRY_CHUNK]
        table = await target.engine.arrow(
            carried_vectors_sql(old, new),
            {
                "a": [str(k[0]) for k in chunk],
                "g": [str(k[1]) for k in chunk],
                "t": [str(k[2]) for k in chunk],
                "o": [int(str(k[3])) for k in chunk],
                "m": [str(k[4]) for k in chunk],
            },
        )
        table = _kept(target, table.cast(VECTORS_SCHEMA))
        if not table.num_rows:
            continue
        if index is not None:
            mine = table.filter(pc.equal(table.column("model"), model))
            if mine.num_rows:
                await index.upsert(_vector_rows(mine))
        await target.engine.insert_arrow(new, "message_vectors", table)
        carried += table.num_rows
    return carried


async def purge_erased(target: MessageStore) -> int:
    """Erase from ``target`` (:meth:`~.store.MessageStore.erase_threads`: rows, postings,
    text, lexical and vector indexes) the threads of the registry of erased threads (read
    again first) that have a stored message there; returns how many. A look-up on the
    primary key's prefix, :data:`~.store.ERASE_CHUNK` threads at a time; nothing when the
    registry is empty."""
    await target.erased.load()
    erased = target.erased.identities()
    found: list[tuple[str, str, str]] = []
    for i in range(0, len(erased), ERASE_CHUNK):
        rows = await target.engine.rows(
            threads_present_sql(target.database, erased[i : i + ERASE_CHUNK]), {}
        )
        found.extend((str(r[0]), str(r[1]), str(r[2])) for r in rows)
    if found:
        log.warning(
            "%s: erasing %d erased threads copied before their erasure", target.database, len(found)
        )
        await target.erase_threads(found)
    return len(found)


def _kept(target: MessageStore, table: pa.Table) -> pa.Table:
    """``table`` without the rows of threads in the registry of erased threads."""
    if not len(target.erased) or not table.num_rows:
        return table
    threads = zip(
        *(table.column(c).to_pylist() for c in ("account_id", "agent_id", "thread_id")),
        strict=True,
    )
    keep = [t not in target.erased for t in threads]
    return table if all(keep) else table.filter(pa.array(keep, pa.bool_()))


def _vector_rows(table: pa.Table) -> list[VectorRow]:
    cols = [table.column(c).to_pylist() for c in ("account_id", "agent_id", "thread_id", "offset")]
    vecs = table.column("vec").combine_chunks()
    flat = vecs.flatten().to_numpy(zero_copy_only=False)
    matrix = flat.reshape(len(vecs), len(flat) // len(vecs))
    return [
        VectorRow(a, g, t, o, matrix[i]) for i, (a, g, t, o) in enumerate(zip(*cols, strict=True))
    ]
